"""I/O: the HTTP API starter (`python starter.py serve`) - start requests, follow them, decide approvals."""
