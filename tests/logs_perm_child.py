"""Permission-denied scenario. Root reads any file, so as root the tailer runs in a forked
child that drops to uid 65534 (nobody) after every module is imported; the parent changes
the file's permissions between the child's polls."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from logs_support import Clock, Writer, config, gw, hits, source


def _child(log: Path, cmd_r: int, res_w: int) -> None:
    if os.getuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    src = source(config([log], log.parent, from_beginning=False, state=False), Clock())
    with os.fdopen(cmd_r) as cmds, os.fdopen(res_w, "w") as out:
        for _ in cmds:
            src.poll()
            st = src.entries[0].follower.status
            out.write(json.dumps({"hits": hits(src), "status": st[0] if st else None}) + "\n")
            out.flush()


def run_permission_scenario() -> dict:
    base = Path(tempfile.mkdtemp(prefix="cachemon-perm-"))
    os.chmod(base, 0o777)
    log = base / "app.log"
    w = Writer(log)
    w.write(gw(100))                           # before first sight: from the end, not read
    os.chmod(log, 0o000)
    cmd_r, cmd_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                # child
        code = 1
        try:
            os.close(cmd_w)
            os.close(res_r)
            _child(log, cmd_r, res_w)
            code = 0
        finally:
            os._exit(code)
    os.close(cmd_r)
    os.close(res_w)
    cmds, res = os.fdopen(cmd_w, "w"), os.fdopen(res_r)
    try:
        def poll():
            cmds.write("poll\n")
            cmds.flush()
            return json.loads(res.readline())
        first = poll()
        w.write(gw(5))                         # written while unreadable: must not be lost
        os.chmod(log, 0o644)
        w.write(gw(7))
        after = poll()
        return {"before": first["hits"], "status": first["status"], "after": after["hits"]}
    finally:
        cmds.close()
        os.waitpid(pid, 0)
        res.close()
        w.close()
        shutil.rmtree(base, ignore_errors=True)
