"""vLLM's KV-cache event stream, the transport only (ZMQ SUB + replay DEALER): frames, sequence
numbers, gaps, restarts, reconnects. Decoding is ``normalise.kv_decode``'s; the daemon stage
(``runtime.kv_stage``) joins the two. pyzmq is imported only when a stream starts."""
