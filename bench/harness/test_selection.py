"""Unit tests of which scenarios run against which servers (harness/selection.py).
Run from the repository's root (scripts/test-all does, before the bench smoke run):

    python3 -B -m unittest discover -s bench/harness -t bench
"""

import unittest

from .scenarios import SCENARIOS
from .selection import could_take_part, select
from .servers import SERVERS

ALL_SERVERS = list(SERVERS)
CLAIMS = ["claims", "claims-full", "claims-pg"]
H3 = ["h3-small", "h3-large", "h3-idle-rss"]


def names(scenarios):
    return [sc.name for sc in scenarios]


class NamedScenarios(unittest.TestCase):
    """A scenario named on the command line gets its dedicated server added."""

    def test_claims_without_tern_demo_adds_it_with_one_note(self):
        got = select(["small-50", "claims", "claims-full"], ["nginx", "tern"])
        self.assertEqual(names(got.scenarios), ["small-50", "claims", "claims-full"])
        self.assertEqual(got.servers, ["nginx", "tern", "tern-demo"])
        self.assertEqual(got.notes, ["claims, claims-full: no server in --servers takes part, so "
                                     "tern-demo was added (it takes part in nothing else)"])

    def test_h3_rows_without_an_http3_server_add_caddy_not_tern(self):
        # tern would join small-50 as well: only a server that takes part in nothing else is added
        got = select(["small-50", "h3-small"], ["nginx", "h2o"])
        self.assertEqual(names(got.scenarios), ["small-50", "h3-small"])
        self.assertEqual(got.servers, ["nginx", "h2o", "caddy"])
        self.assertEqual(len(got.notes), 1)
        self.assertIn("h3-small: no server in --servers takes part, so caddy was added", got.notes[0])

    def test_h3_rows_with_tern_need_nothing_added(self):
        got = select(["h3-small"], ["tern"])
        self.assertEqual(got.servers, ["tern"])
        self.assertEqual(got.notes, [])

    def test_a_scenario_no_dedicated_server_serves_is_left_out_with_a_note(self):
        # the floor serves no gzip: adding nginx or tern would change the other rows
        got = select(["small-50", "gzip"], ["floor"])
        self.assertEqual(names(got.scenarios), ["small-50"])
        self.assertEqual(got.servers, ["floor"])
        self.assertEqual(got.notes, ["not run, no server in --servers takes part: gzip "
                                     "(only nginx, h2o, tern or tern-uring does)"])

    def test_nothing_left_is_an_empty_selection(self):
        got = select(["gzip"], ["caddy"])
        self.assertEqual(got.scenarios, [])
        self.assertEqual(len(got.notes), 1)

    def test_served_scenarios_change_nothing(self):
        got = select(["claims", "small-50"], ["tern-demo", "nginx"])
        self.assertEqual(names(got.scenarios), ["small-50", "claims"])  # table order
        self.assertEqual(got.servers, ["nginx", "tern-demo"])  # interleaving order
        self.assertEqual(got.notes, [])


class DefaultSet(unittest.TestCase):
    """No scenario named: the user chose the servers, so nothing is added; what none of them
    serves is left out, in one note."""

    def test_all_servers_run_everything_without_a_note(self):
        got = select([], ALL_SERVERS)
        self.assertEqual(names(got.scenarios), names(SCENARIOS))
        self.assertEqual(got.servers, ALL_SERVERS)
        self.assertEqual(got.notes, [])

    def test_without_tern_demo_and_caddy_skips_claims_and_h3_in_one_line(self):
        got = select([], ["nginx", "h2o", "floor"])
        self.assertEqual(got.servers, ["nginx", "h2o", "floor"])
        self.assertEqual(names(got.scenarios), [n for n in names(SCENARIOS) if n not in CLAIMS + H3])
        self.assertEqual(got.notes, [
            "not run, no server in --servers takes part: h3-small, h3-large, h3-idle-rss "
            "(only tern, tern-uring or caddy does); claims, claims-full, claims-pg (only tern-demo does)"])

    def test_tern_serves_the_h3_rows_but_not_claims(self):
        got = select([], ["tern", "nginx"])
        self.assertEqual(got.notes, ["not run, no server in --servers takes part: claims, "
                                     "claims-full, claims-pg (only tern-demo does)"])
        self.assertTrue(set(H3) <= set(names(got.scenarios)))

    def test_every_scenario_has_a_server(self):
        # a row no server can take part in would always be left out
        for sc in SCENARIOS:
            self.assertTrue(any(could_take_part(sc, n) for n in SERVERS), sc.name)

if __name__ == "__main__":
    unittest.main()
