"""Which CUDA IPC objects leave files in /dev/shm after both processes exit (hmgstore.Producer's teardown).

For each case, a spawned child opens what the parent shares, both use it, both exit (the parent's work runs in a
child of its own, so that its CUDA context ends too), and the new /dev/shm entries are listed:

- ``event-kept``: an interprocess event, its handle opened by the other process; nobody destroys it before exit;
- ``event-destroyed``: the same, both sides destroying their event objects (and torch's IPC limbo) before exit;
- ``memory``: a CUDA tensor sent through a torch.multiprocessing queue, no events of ours.

Prints one JSON line per case. Run: ``python benchmarks/probes/probe_ipc_shm.py`` (a GPU machine).
"""
import gc
import json
import os
import sys
import time

import torch
import torch.multiprocessing as mp


def opener(case, handle_q, done_q):
    torch.cuda.set_device(0)
    item = handle_q.get()
    if case == "memory":
        item.add_(1)
    else:
        event = torch.cuda.Event.from_ipc_handle(0, item)
        torch.cuda.current_stream().wait_event(event)
        if case == "event-destroyed":
            del event
    torch.cuda.synchronize()
    del item
    gc.collect()
    done_q.put("ok")


def owner(case):
    ctx = mp.get_context("spawn")
    handle_q, done_q = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=opener, args=(case, handle_q, done_q))
    child.start()
    if case == "memory":
        x = torch.zeros(1 << 20, device="cuda")
        handle_q.put(x)
    else:
        event = torch.cuda.Event(interprocess=True)
        event.record()
        handle_q.put(event.ipc_handle())
    done_q.get(timeout=60)
    child.join(timeout=60)
    if case == "event-destroyed":
        del event
        torch.cuda.ipc_collect()
    gc.collect()


if __name__ == "__main__":
    for case in ("event-kept", "event-destroyed", "memory"):
        before = set(os.listdir("/dev/shm"))
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=owner, args=(case,))
        p.start()
        p.join(timeout=120)
        time.sleep(0.5)
        left = sorted(set(os.listdir("/dev/shm")) - before)
        print(json.dumps({"case": case, "exit": p.exitcode, "left_in_dev_shm": left}), flush=True)
        for name in left:  # leave the machine as it was, for the next case
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError as err:
                print(f"could not remove {name}: {err}", file=sys.stderr)
