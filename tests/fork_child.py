"""A fork server for tests/test_fork_server.py: `python -m tests.fork_child --serve`."""
import os
import sys
import time

from pipeline.workloads.fork_server import serve


def handle(request: dict) -> dict:
    if "exit" in request:  # a child that dies without an answer
        os._exit(request["exit"])
    if "sleep" in request:  # a child that hangs
        time.sleep(request["sleep"])
    if "raise" in request:
        raise ValueError(request["raise"])
    print("a stray line on stdout")  # must not reach the server's answers
    return {"pid": os.getpid(), "server": os.getppid(), "echo": request.get("echo")}


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    sys.exit(serve(["json"], handle))
