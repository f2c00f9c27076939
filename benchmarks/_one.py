"""Run one benchmark module in this process and print its rows as JSON (used by run.py)."""
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
rows = importlib.import_module(sys.argv[1]).run()
print(json.dumps(rows))
