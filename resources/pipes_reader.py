"""The runner's Pipes messages, read from a file one whole line at a time.

Dagster's file reader (PipesTempFileMessageReader, PipesSubprocessClient's default) tails the
file with readline() and parses each line it gets. A reader can get a line the runner is still
appending: Linux grows a file a page at a time while a write is copied in, so a message that
crosses a 4 KB page boundary can be seen cut short. Dagster's reader thread then dies on the half
line (JSONDecodeError) and every later message of the sweep is lost: its logs, its table
reports and its closing message. `make run` hit it once (2026-11-27 09:46, gemm_samples, 3319
rows of progress). This reader keeps a line until its newline has arrived.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from threading import Event, Thread
from typing import Callable, Iterator

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter

POLL_S = 0.01  # how often an idle file is read again (Dagster's reader: the same)


def whole_lines(path: str, should_stop: Callable[[], bool], poll_s: float = POLL_S) -> Iterator[str]:
    """Each line appended to `path`, once its newline is there, until should_stop() and the file
    has nothing more; a last line never finished is dropped."""
    with open(path, encoding="utf-8") as f:
        held = ""
        while True:
            got = f.readline()
            if got:
                held += got
                if held.endswith("\n"):
                    yield held
                    held = ""
            elif should_stop():
                return
            else:
                time.sleep(poll_s)


class WholeLineMessageReader(dg.PipesMessageReader):
    """PipesTempFileMessageReader's protocol (a temporary file the runner appends JSON lines to),
    read with whole_lines."""

    def __init__(self, include_stdio_in_messages: bool = False):
        self.include_stdio_in_messages = include_stdio_in_messages

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with tempfile.TemporaryDirectory(prefix="devchar-pipes-") as tmp:
            path = os.path.join(tmp, "messages.jsonl")
            open(path, "w", encoding="utf-8").close()
            done = Event()
            thread = Thread(target=self._read, args=(path, handler, done), daemon=True)
            thread.start()
            try:
                yield {PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                       PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: self.include_stdio_in_messages}
            finally:
                done.set()
                thread.join()

    @staticmethod
    def _read(path: str, handler, done: Event) -> None:
        try:
            for line in whole_lines(path, done.is_set):
                handler.handle_message(json.loads(line))
        except Exception:  # noqa: BLE001 - reported to the run, as Dagster's own reader does
            handler.report_pipes_framework_exception("WholeLineMessageReader reader thread", sys.exc_info())
            raise

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file, one whole line at a time."
