"""Resumable bench results: the rows an earlier (perhaps killed) run already wrote, and
JSON written whole (a run killed while writing leaves the previous file)."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from specdec_jax.app import files


def saved_rows(json_path: str, same_settings: Callable[[dict], bool],
               key: Callable[[dict], Any]) -> dict:
  """{key(row): row} for the rows of the JSON at json_path ({'rows': [...], ...}), if
  the file exists and same_settings(its contents) says it was written with this run's
  settings; else {} (every row is decoded again)."""
  if not os.path.exists(json_path):
    return {}
  with open(json_path) as f:
    saved = json.load(f)
  return {key(row): row for row in saved['rows']} if same_settings(saved) else {}


# Strict JSON through a temporary file and a rename: a run killed mid-write keeps the
# last whole file (`specdec_jax.app.files.write_json`).
write_json = files.write_json
