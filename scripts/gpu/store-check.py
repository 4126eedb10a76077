#!/usr/bin/env python3
"""Serves a real torch.distributed.TCPStore for p2p's store client (p2p_transport::rendezvous::store).

    python3 store-check.py [--backend libuv|classic|both] [-- CMD ARGS...]

For each backend: starts TCPStore(127.0.0.1, free port, is_master=True), sets
p2p-store-check/from-torch, prints "PORT <n> <backend>", and, when p2p-store-check/from-rust
appears, sets p2p-store-check/echo to its value. With CMD, runs CMD with P2P_STORE_CHECK_PORT
set (the store test binary: `P2P_TEST -- --ignored --exact
rendezvous::store::tests::store_against_torch`) and exits non-zero if it fails; without, waits
60 s for a client. Prints "store-check <backend>: pass|FAIL" per backend.
"""
import os, subprocess, sys, threading
from datetime import timedelta

import torch
import torch.distributed as dist


def one(backend, cmd):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30), use_libuv=(backend == "libuv"))
    store.set("p2p-store-check/from-torch", f"hello from torch {torch.__version__} ({backend})")
    print(f"PORT {store.port} {backend}", flush=True)
    echoed = threading.Event()

    def echo():
        try:
            store.wait(["p2p-store-check/from-rust"], timedelta(seconds=60))
            store.set("p2p-store-check/echo", store.get("p2p-store-check/from-rust"))
            echoed.set()
        except Exception as e:  # the wait's timeout: reported below
            print(f"echo: {e}", flush=True)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    if cmd:
        env = dict(os.environ, P2P_STORE_CHECK_PORT=str(store.port))
        rc = subprocess.run(cmd, env=env, timeout=120).returncode
    else:
        t.join(65)
        rc = 0
    ok = rc == 0 and echoed.is_set()
    print(f"store-check {backend}: {'pass' if ok else 'FAIL'} (rc {rc}, echoed {echoed.is_set()})", flush=True)
    return ok


def main():
    args = sys.argv[1:]
    cmd = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    backend = args[args.index("--backend") + 1] if "--backend" in args else "both"
    backends = ["libuv", "classic"] if backend == "both" else [backend]
    results = [one(b, cmd) for b in backends]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
