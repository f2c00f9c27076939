"""`cachemon demo` (command.py) and the server that plays recorded vLLM pages back (replay.py),
which the tests and benchmarks use too. The pages it replays ship in cachemon/data/captures/."""
