"""The read API: `cocaq serve` on the head node (server.py, its routes in routes/, what they share in
deps.py), its client in the login-node commands (client.py), and the MUNGE credentials that prove a
caller's uid (munge.py).  See docs/api.md."""
