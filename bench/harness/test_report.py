"""Unit tests of the end of a run without matplotlib (harness/report.py, prepare.py): the
results are written, the chart is skipped with a note, and nothing waits for it.
Run as test_selection.py says."""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from unittest import mock

from . import prepare, report

# None in sys.modules makes `import matplotlib` raise ImportError, as on a machine without it
WITHOUT_MATPLOTLIB = {"matplotlib": None, "matplotlib.pyplot": None}


def a_run(notes=()):
    """A results document with what report.markdown reads and no scenarios."""
    return {
        "date": "2026-12-01 00:00 UTC",
        "mode": "smoke",
        "command": "bench/run --smoke",
        "machine": {"cores": 2, "cpu": "test", "kernel": "6", "os": "Debian"},
        "settings": {"rounds": 1, "duration_s": 1},
        "versions": {},
        "servers": ["nginx"],
        "scenarios": [],
        "notes": list(notes),
    }


class WithoutMatplotlib(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tern-bench-test-")
        self.png = os.path.join(self.dir, "latest.png")

    def tearDown(self):
        for name in os.listdir(self.dir):
            os.remove(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def write(self, doc):
        out = io.StringIO()
        with mock.patch.dict(sys.modules, WITHOUT_MATPLOTLIB), redirect_stdout(out):
            md, drawn = report.write_all(doc, self.dir, redraw="bench/run --render X")
        return md, drawn, out.getvalue()

    def test_the_import_failure_is_seen(self):
        with mock.patch.dict(sys.modules, WITHOUT_MATPLOTLIB):
            self.assertIn("matplotlib", report.matplotlib_missing())

    def test_results_are_written_and_the_chart_skipped_with_one_line(self):
        with open(self.png, "w") as f:
            f.write("an earlier run's chart")
        md, drawn, printed = self.write(a_run(["an earlier note"]))
        self.assertFalse(drawn)
        self.assertFalse(os.path.exists(self.png), "a stale chart would show old numbers")
        lines = printed.splitlines()
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0].startswith("note: chart skipped: matplotlib cannot be imported ("))
        self.assertIn("python3 -m pip install matplotlib", lines[0])
        self.assertIn("bench/run --render X", lines[0])
        with open(os.path.join(self.dir, "latest.json")) as f:
            notes = json.load(f)["notes"]
        self.assertEqual(notes[0], "an earlier note")
        self.assertTrue(notes[1].startswith("chart skipped"))
        with open(os.path.join(self.dir, "latest.md")) as f:
            text = f.read()
        self.assertIn("Note: chart skipped", text)
        self.assertNotIn("latest.png", text)
        self.assertIn(md, text)

    def test_a_redrawn_results_file_keeps_one_chart_note(self):
        doc = a_run()
        self.write(doc)
        self.write(doc)  # as bench/run --render does with the JSON written above
        self.assertEqual(sum(t.startswith("chart skipped") for t in doc["notes"]), 1)

    def test_the_readme_block_has_no_image_without_a_chart(self):
        readme = os.path.join(self.dir, "README.md")
        with open(readme, "w") as f:
            f.write(f"intro\n{report.BEGIN}\nold\n{report.END}\n")
        report.update_readme(readme, "the tables", chart=False)
        with open(readme) as f:
            self.assertEqual(f.read(), f"intro\n{report.BEGIN}\nthe tables\n{report.END}\n")

    def test_a_failed_install_is_a_warning_not_a_failure(self):
        failed = subprocess.CompletedProcess([], returncode=1)
        out = io.StringIO()
        with mock.patch.dict(sys.modules, WITHOUT_MATPLOTLIB), \
                mock.patch.object(prepare.subprocess, "run", return_value=failed) as pip, \
                redirect_stdout(out):
            prepare.ensure_matplotlib()
        self.assertEqual(pip.call_count, 2)  # as is, then --user --break-system-packages
        self.assertIn("warning: matplotlib could not be installed", out.getvalue())


if __name__ == "__main__":
    unittest.main()
