"""``lip info``: the model card of a model file (read from the file alone)."""

from __future__ import annotations

from typing import Any

from lipcli.cli.common import cli_errors, print_json, stdout_console
from lipcli.cli.options import JsonOption, ModelArgument


@cli_errors
def info(model: ModelArgument = None, json_out: JsonOption = False) -> None:
    """Show MODEL's card: components, data set, Lipschitz bound, results, training.

    Read from the file alone (no data, no network built), so it also works when
    a plugin the model needs is not installed; the card names what is missing.
    """
    from lipcli.info import model_card
    from lipcli.host.runs import resolve_model_argument
    from lipcli._util.safetext import clean_tree

    card = model_card(resolve_model_argument(model))
    if json_out:  # the file's strings without control characters (:mod:`lipcli._util.safetext`)
        print_json(clean_tree(card.to_json()))
    else:
        print_card(card)


def _fmt(value: Any, digits: int = 6) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _for_weights(match: bool | None) -> str:
    """Whether a stored record belongs to the file's weights (its ``weights_sha256``)."""
    if match is None:
        return "weights not recorded"
    return "for these weights" if match else "for OTHER weights: the file was replaced since; rerun"


def _certification_line(cert: Any) -> str:
    """One stored certification (a :class:`~lipcli.info.StoredCertification`) as a line."""
    radii = ", ".join(f"{_fmt(r['radius_units'])}: {100 * r['certified_accuracy']:.2f}%"
                      for r in cert.radii)
    ds_c = cert.dataset or {}
    attack = cert.attack
    return (f"lip certify ({cert.certificate}, Lipschitz {cert.lipschitz}, "
            f"{'sound' if cert.sound else 'NOT sound'}) on {ds_c.get('name')} "
            f"{ds_c.get('split')} ({cert.total} points): clean {100 * cert.clean_accuracy:.2f}%, "
            f"certified at {radii} (radii x1/{_fmt(cert.radius_unit)})"
            + ("" if not attack else f"; PGD check {attack['steps']} steps x {attack['restarts']}: "
               f"{attack['violations']} violations") + f" ({_for_weights(cert.weights_match)})")


def print_card(card: Any) -> None:
    """A :class:`~lipcli.info.ModelCard` on stdout (plain text, no markup, control characters
    removed: file strings are inert)."""
    from rich.table import Table

    from lipcli._util.safetext import clean

    console = stdout_console()

    def say(text: str) -> None:
        console.print(clean(text), soft_wrap=True, highlight=False, markup=False)

    say(f"{card.file}: {card.bytes:,} bytes, sha256 {card.sha256}")
    say(f"written by lipcli {card.written_by} (format {card.format_version}); input "
        f"{'x'.join(map(str, card.input_shape))}, {card.num_classes} classes")
    table = Table(title="components", title_justify="left")
    for col in ("kind", "name", "parameters", "distribution", "installed"):
        table.add_column(col)
    for comp in card.components:
        params = ", ".join(f"{k}={v}" for k, v in comp.params.items()) or "-"
        table.add_row(*(clean(cell) for cell in (comp.kind, comp.name, params, comp.distribution)),
                      "yes" if comp.installed else "NO")
    console.print(table)
    counts = card.parameters
    say("parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    ds = card.dataset or {}
    norm = card.normalization or {}
    say(f"data set: {ds.get('name', '-')} {ds.get('params') or ''} sizes {ds.get('sizes', '-')}; "
        f"normalisation mean {norm.get('mean')}, std {norm.get('std')}")
    lip = card.lipschitz
    if lip:
        say(f"Lipschitz as stored in the file (not rechecked here): {lip.upper_bound_label} "
            f"{_fmt(lip.upper_bound, 8)}; "
            f"estimate {_fmt(lip.estimate, 8)} (not guaranteed); empirical lower bound "
            f"{_fmt(lip.empirical_lower, 8)} ({_for_weights(lip.weights_match)})")
    else:
        say("Lipschitz: none stored (lip lipschitz MODEL --write)")
    res = card.results or {}
    if "test_accuracy" in res:
        say(f"training evaluation: test accuracy {_fmt(res['test_accuracy'], 4)} on "
            f"{res.get('test_examples')} images ({res.get('selection')}; "
            f"{_for_weights(res.get('weights_match'))})")
    cert = res.get("certify")
    if cert:
        say(_certification_line(cert))
        others = [c for c in res.get("certify_runs") or [] if c != cert]
        for other in others:
            say("  also stored: " + _certification_line(other))
    else:
        say("lip certify: no stored results")
    tr = card.training
    if tr:
        say("training: " + ", ".join(f"{k} {_fmt(v)}" for k, v in tr.items()))
    if card.recipe:
        given = card.recipe["overrides"]
        say(f"recipe: {card.recipe['name']}; " + ("settings given over it: " + ", ".join(
            f"{k} {_fmt(v.get('value') if isinstance(v, dict) else v)} (recipe "
            f"{_fmt(v.get('recipe') if isinstance(v, dict) else None)})" for k, v in given.items())
            if given else "no setting given over it"))
    for note in card.notes:
        say(f"note: {note}")
