"""The Pipes message reader keeps a line the runner is still writing until its newline is there."""
import json
import threading
import time

from resources.pipes_reader import WholeLineMessageReader, whole_lines


def test_a_line_seen_half_written_is_read_whole(tmp_path):
    path = tmp_path / "messages.jsonl"
    path.write_text("")
    msg = json.dumps({"method": "log", "params": {"message": "x" * 5000}})
    stop = threading.Event()

    def write():  # the runner's append, seen by the reader between its two halves
        with open(path, "a", encoding="utf-8") as f:
            f.write(msg[:63])
            f.flush()
            time.sleep(0.1)
            f.write(msg[63:] + "\n" + '{"method": "closed"}\n' + '{"never": "fini')
        stop.set()

    writer = threading.Thread(target=write)
    writer.start()
    got = list(whole_lines(str(path), stop.is_set, poll_s=0.005))
    writer.join()
    assert [json.loads(line) for line in got] == [json.loads(msg), {"method": "closed"}]  # the unfinished one dropped


class _Handler:
    def __init__(self):
        self.messages, self.errors = [], []

    def handle_message(self, message):
        self.messages.append(message)

    def report_pipes_framework_exception(self, origin, exc_info):
        self.errors.append(origin)


def test_the_reader_hands_on_every_message_and_reports_a_corrupt_one():
    handler = _Handler()
    with WholeLineMessageReader().read_messages(handler) as params:
        with open(params["path"], "a", encoding="utf-8") as f:
            f.write('{"method": "opened"}\n')
    assert handler.messages == [{"method": "opened"}] and not handler.errors

    bad = _Handler()
    with WholeLineMessageReader().read_messages(bad) as params:
        with open(params["path"], "a", encoding="utf-8") as f:
            f.write("not json\n")
    assert bad.errors == ["WholeLineMessageReader reader thread"]
