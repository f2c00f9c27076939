"""The simulators `cachemon analyze` replays vLLM's prefix cache with."""
