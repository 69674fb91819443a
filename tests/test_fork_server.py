"""The fork server that starts CPU workload steps in fresh processes (workloads/fork_server.py)."""
import os

from pipeline.workloads.fork_server import ForkServer


def test_each_request_gets_a_fresh_child_of_one_server():
    server = ForkServer("tests.fork_child")
    try:
        first, second = server.request({"echo": 1}, 30), server.request({"echo": [2]}, 30)
        assert (first["echo"], second["echo"]) == (1, [2])
        assert first["pid"] != second["pid"] and first["server"] == second["server"] != os.getpid()
    finally:
        server.close()


def test_a_failing_dying_or_hanging_child_is_an_answer_and_the_server_goes_on():
    server = ForkServer("tests.fork_child")
    try:
        assert server.request({"raise": "bad shape"}, 30) == {"error": "ValueError: bad shape"}
        assert server.request({"exit": 3}, 30) == {"error": "it died without a result (exit 3)"}
        before = server.request({}, 30)["server"]
        assert server.request({"sleep": 30}, 0.5) is None  # killed with its server
        after = server.request({"echo": "again"}, 30)  # a new server answers
        assert after["echo"] == "again" and after["server"] != before
    finally:
        server.close()


def test_a_server_killed_between_requests_is_started_again():
    import signal

    server = ForkServer("tests.fork_child")
    try:
        first = server.request({}, 30)["server"]
        os.kill(first, signal.SIGKILL)  # found dead on the next request, or when it does not answer
        again = server.request({"echo": 1}, 30)
        assert again["echo"] == 1 and again["server"] != first
    finally:
        server.close()
