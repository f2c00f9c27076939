"""`cachemon analyze`: replay vLLM's prefix cache on request logs and name what breaks reuse."""
