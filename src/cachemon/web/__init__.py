"""The HTTP(S) server: listener, connections, worker threads, the web config (TLS, basic auth)."""
