"""The judge: from a snapshot of the state to the causes of missed tokens. Pure: no I/O, no threads."""
