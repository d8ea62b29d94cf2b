"""Which scenarios run against which servers, decided from the command line before anything
is installed or built, so that a scenario none of `--servers` can take part in is never
silently left out.

A scenario the user named on the command line gets the server it needs added, when that
server is a dedicated one: an application (tern-demo, for the claims scenarios) or an
HTTP/3-only server (Caddy, for the h3 rows). Such a server takes part in nothing else, so
adding it changes no other row. A general server (tern, nginx, …) is never added: it would
join every other selected scenario too. Any other scenario without a server, and every one
from the default set (no names given: the user chose the servers, not the scenarios), is
left out with a note naming the servers it needs."""

from dataclasses import dataclass, field

from .scenarios import SCENARIOS
from .servers import SERVERS


class _ServerKind:
    """What Scenario.applies_to reads of a server, taken from its class: the selection is made
    before any binary exists. tern's TLS and HTTP/3 depend on its binary (properties on the
    class); they are assumed here, and bench/run notes a tern binary without them later."""

    def __init__(self, cls):
        self.name = cls.name
        self.app, self.canned, self.h3_only = cls.app, cls.canned, cls.h3_only
        self.tls = cls.tls if isinstance(cls.tls, bool) else True
        self.h3 = cls.h3 if isinstance(cls.h3, bool) else True


def could_take_part(scenario, server_name):
    return scenario.applies_to(_ServerKind(SERVERS[server_name]))


def _dedicated(server_name):
    """A server that takes part only in the scenarios made for it: adding it changes no other row."""
    cls = SERVERS[server_name]
    return cls.app or cls.h3_only


@dataclass
class Selection:
    scenarios: list  # the Scenario rows to run, in table order
    servers: list  # server names, in SERVERS order (the interleaving order)
    notes: list = field(default_factory=list)  # one line each: printed, and kept in the report


def select(named, server_names, scenarios=SCENARIOS):
    """named: the scenario names on the command line (empty: the default set, all of them);
    server_names: those of --servers. Both already checked to exist."""
    explicit = bool(named)
    chosen = [sc for sc in scenarios if not explicit or sc.name in named]
    servers = list(server_names)
    # judged against --servers as given, so that one added server is noted with every
    # scenario it was added for
    unserved = [sc for sc in chosen if not any(could_take_part(sc, n) for n in servers)]

    added = {}  # server name -> the scenarios it was added for
    skipped = {}  # the servers that could take part -> the scenarios left out for want of one
    for sc in unserved:
        able = [n for n in SERVERS if could_take_part(sc, n)]
        dedicated = [n for n in able if _dedicated(n)]
        if explicit and dedicated:
            for n in dedicated:
                added.setdefault(n, []).append(sc.name)
        else:
            skipped.setdefault(tuple(able), []).append(sc.name)

    notes = []
    for n, for_scenarios in added.items():
        notes.append(f"{', '.join(for_scenarios)}: no server in --servers takes part, so {n} "
                     f"was added (it takes part in nothing else)")
    if skipped:
        why = "; ".join(f"{', '.join(names)} (only {_either(able)} does)" for able, names in skipped.items())
        notes.append(f"not run, no server in --servers takes part: {why}")

    skipped_names = {name for names in skipped.values() for name in names}
    return Selection(
        scenarios=[sc for sc in chosen if sc.name not in skipped_names],
        servers=[n for n in SERVERS if n in servers or n in added],
        notes=notes,
    )


def _either(names):
    if not names:
        return "a server this bench does not have"  # (a row no server could take)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
