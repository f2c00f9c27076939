"""The log source's series (sources/logs)."""
from __future__ import annotations

from cachemon.catalog.kv_events import REASON
from cachemon.catalog.spec import SERIES_LABELS, UPSTREAM, _m

FILE = "file"
LOG_LINES = _m(
    "log_lines", "counter", "lines", (UPSTREAM, "outcome"),
    "Log lines read, by outcome: parsed (a stats line or a user rule matched), unmatched, malformed "
    "(looked like a stats line but did not parse), too_long (over max_line_bytes; skipped, since a cut line "
    "could carry a cut number).",
    "log tailer",
)
LOG_BYTES = _m(
    "log_read_bytes", "counter", "bytes", (UPSTREAM,),
    "Bytes read from the log files.",
    "log tailer",
)
LOG_ROTATIONS = _m(
    "log_rotations", "counter", "", (UPSTREAM,),
    "Rotations followed (rename+create, delete+recreate, symlink switch).",
    "log tailer",
)
LOG_TRUNCATIONS = _m(
    "log_truncations", "counter", "", (UPSTREAM,),
    "Truncations detected (copytruncate): the file shrank below the read offset.",
    "log tailer",
)
LOG_FILES_OPEN = _m(
    "log_files_open", "gauge", "", (UPSTREAM,),
    "Log files currently open.",
    "log tailer",
)
LOG_FILES_REFUSED = _m(
    "log_files_refused", "counter", "", (UPSTREAM, REASON),
    "Log files matched but never read, each counted once per reason: own_output (cachemon's own stdout, "
    "stderr or log file: tailing it would feed on itself), foreign_owner (running as root, a file the "
    "service user could not read: not owned by logs.expected_owner or the watched directory's owner, "
    "and not readable by everyone or that owner's group), symlink (a glob or directory matched a symlink "
    "that leaves the directory, does not resolve, or names a file not of the directory's owner).",
    "log tailer",
)
LOG_FILES_FORGOTTEN = _m(
    "log_files_forgotten", "counter", "", (UPSTREAM,),
    "Files of a glob or directory, still matched, that the tailer stopped remembering because more than "
    "16384 closed files were remembered for the entry: each is read again from its start after a restart "
    "(its lines counted twice). 0 unless a log directory holds that many files.",
    "log tailer",
)
LOG_STATS_AGE = _m(
    "log_last_stats_line_timestamp_seconds", "gauge", "seconds", (UPSTREAM, FILE),
    "Unix time at which cachemon read the last parsed stats line of the file (vLLM logs none while idle): "
    "its age is time() minus this.",
    "log tailer",
)
LOG_STATE_SAVE_ERRORS = _m(
    "log_state_save_errors", "counter", "", (),
    "Failed writes of the log state file (offsets + counters). After a restart the tailer resumes "
    "from the last good save.",
    "log tailer",
)
LOG_STATE_LOAD_ERRORS = _m(
    "log_state_load_errors", "counter", "", (),
    "Starts at which the log state file was unusable (unreadable, damaged, other schema, or a valid checksum "
    "over content of the wrong type); logs.on_state_error decided where reading resumed.",
    "log tailer",
)
PROMPT_TOKENS_ESTIMATED = _m(
    "prompt_tokens_estimated", "counter", "tokens", SERIES_LABELS,
    "ESTIMATE of prompt tokens from the log's 'Avg prompt throughput' x the interval between stats lines. "
    "vLLM >= 0.16 logs computed (uncached) tokens only.",
    "log stats lines",
)
