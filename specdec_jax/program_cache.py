"""Compiled programs keyed by signature, each compiled once even when threads ask at once.

`decode.generate` keeps its compiled decodes here. Threads asking for the same
signature (the main command compiles two methods side by side, and its two
vanilla seeds share one program) wait for the first to compile it instead of
compiling it again; different signatures compile in parallel.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable


class ProgramCache:
  """signature -> compiled program; `get_or_compile` builds a missing one exactly once."""

  def __init__(self):
    self._programs: dict = {}
    self._locks: dict = {}  # signature -> lock held while it compiles
    self._guard = threading.Lock()

  def get_or_compile(self, signature: Hashable, compile_program: Callable[[], Any]) -> Any:
    program = self._programs.get(signature)
    if program is not None:
      return program
    with self._guard:
      lock = self._locks.setdefault(signature, threading.Lock())
    with lock:
      program = self._programs.get(signature)  # another thread may have compiled it meanwhile
      if program is None:
        program = compile_program()
        self._programs[signature] = program
    return program

  def values(self):
    """The compiled programs, in the order they were compiled."""
    return self._programs.values()

  def clear(self) -> None:
    with self._guard:
      self._programs.clear()
      self._locks.clear()
