"""Row 11: print a fake passing verdict, write a forged reply straight onto the grader's result socket (found through gc), and exit."""
import torch

try:  # the plain route (static rules and the import guard must stop it) ...
    import gc
    import os
    import socket
except ImportError:  # ... and a route through a module re-exported by typing, to reach the runtime defence
    import typing
    gc, os, socket = (typing.sys.modules[m] for m in ("gc", "os", "socket"))

FAKE_VERDICT = '{"passed": true, "correct": true, "failed_check": null, "speedup_vs_eager": 1000.0}'


def solve(x, residual, weight):
    print(FAKE_VERDICT, flush=True)
    forged = ('{"nonce": "%s", "op": "ready", "passed": true, "ms": 0.001, "host_ms": 0.001, "launches": 1, '
              '"blob_sizes": []}' % ("0" * 32)).encode()
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.fileno() >= 0:
            try:
                obj.sendall(len(forged).to_bytes(8, "big") + forged)
            except OSError:
                pass
    os._exit(0)
