"""What one configured log path names: a file, a glob, or a directory.

A directory stands for the ``*.log`` files directly in it. That is how vllm-ascend writes
its own log (``vllm_ascend/logger.py``, ``RotatingAscendFileHandler``, since v0.22.1rc1): into
``~/ascend/log/vllm_ascend/`` (``additional_config.ascend_log_path``), a new
``vllm_ascend_<YYYYmmdd_HHMMSS>_<pid>.log`` per process start and a new
``..._002.log``, ``..._003.log`` each time the current one reaches 20 MiB. The old file is
closed, never renamed: a glob or a directory follows the set, and every series keeps the
label of the configured path (no new label value per file).

A path is a directory when it ends with ``/`` or is one now (it is looked at on every poll:
vllm-ascend creates the directory when it starts, possibly after cachemon).
"""
from __future__ import annotations

import glob as globmod
import os

DIR_GLOB = "*.log"


def is_dir_spec(path: str) -> bool:
    return path.endswith(os.sep) or (not globmod.has_magic(path) and os.path.isdir(path))


def is_multi(path: str) -> bool:
    """True when the path may name several files at once (glob or directory)."""
    return globmod.has_magic(path) or is_dir_spec(path)


def effective_glob(path: str) -> str:
    """The glob pattern for the files of ``path`` (a plain file path is returned as is)."""
    if is_dir_spec(path):
        return os.path.join(globmod.escape(path.rstrip(os.sep) or os.sep), DIR_GLOB)
    return path


def watch_dir(path: str) -> str:
    """The directory whose file-system events concern ``path``."""
    if is_dir_spec(path):
        return os.path.abspath(path.rstrip(os.sep) or os.sep)
    return os.path.dirname(os.path.abspath(path))


def symlink_refusal(path: str) -> str:
    """Why a symlink matched by a glob or directory must not be followed ("" if it may).

    Whoever can write to a watched directory can plant a link there to any file on the host, and
    running as root cachemon could open it. A link is followed only to a regular file in the same
    directory owned by the directory's owner (a "current" link beside its targets); any other
    needs ``logs.follow_symlinks: true``."""
    d = os.path.dirname(path) or "."
    try:
        target = os.path.realpath(path, strict=True)
        tst, dst = os.stat(target), os.stat(d)
    except (OSError, RuntimeError) as e:     # a loop, a dangling link
        return f"a symlink that does not resolve ({getattr(e, 'strerror', None) or e})"
    if os.path.dirname(target) != os.path.realpath(d):
        return "a symlink to a file outside the watched directory (logs.follow_symlinks: true follows it)"
    if tst.st_uid != dst.st_uid:
        return (f"a symlink to a file owned by uid {tst.st_uid}, not by the directory's owner (uid {dst.st_uid}); "
                "logs.follow_symlinks: true follows it")
    return ""
