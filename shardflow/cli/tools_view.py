"""`shardflow tsv` (a metadata table of shards: tar2tsv) and `shardflow show` (a contact sheet: tarshow).

Both stream samples in shard order (one sample in memory at a time, plus the table rows for
parquet and the first N images for show) and write their file atomically (open_atomic): a table or
sheet appears under its name only when complete.

A cell is data: `tsv` cuts a value longer than `--max-chars` (a 20 MB caption took 1.6 GB to escape
character by character), and in csv output a text cell that a spreadsheet would run as a formula
(starting with = + - @, a tab or a carriage return, and not a plain number) gets a leading `'`, as
the OWASP CSV-injection guidance says; `--raw-cells` writes them as they are.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from typing import Any, Iterator

import click

from shardflow.cli.common import EXIT_ERROR, EXIT_FAILED, Fail, one_line_errors, parse_storage_options, spec_inputs
from shardflow.cli.tools_common import (
    allow_pipe_option,
    expand_all,
    printable,
    progress_bar,
    progress_option,
    refuse_input_as_output,
    storage_option,
)
from shardflow.errors import DEFAULT_ON_ERROR_READ, ShardflowError
from shardflow.shards.samples import read_samples, strays_once
from shardflow.storage import options as so
from shardflow.storage.publish import open_atomic
from shardflow.tools.fields import FieldError, field_value
from shardflow.tools.output_temps import remove_dead_writers_temps, writer_tag
from shardflow.tools.runner import STDOUT


def register(group: click.Group) -> None:
    group.add_command(tsv_command)
    group.add_command(show_command)


def _warn(error: ShardflowError) -> None:
    click.echo(f"shardflow: warning: {printable(error)}", err=True)


def _samples(urls: list[str], options: dict[str, Any] | None, allow_pipe: bool, on_error: str) -> Iterator[Any]:
    for url in urls:
        yield from read_samples(url, on_error=on_error, report=strays_once(_warn),  # one line per shard's strays
                                storage_options=so.options_for(url, options), allow_pipe=allow_pipe)


def _refuse_binary_to_terminal(what: str) -> None:
    """Exit 2 with one line when `-o -` would put binary data (parquet, png) on a terminal, as for a tar."""
    if sys.stdout.isatty():
        raise Fail(f"refusing to write {what} to a terminal: redirect standard output (> FILE) or pipe it", EXIT_ERROR)


def _shown(output: str) -> str:
    return "standard output" if output == STDOUT else printable(output)


def _write_out(url: str, data: bytes, options: dict[str, Any] | None) -> None:
    """`data` to standard output when `url` is `-` (tools.runner.STDOUT), else to the file, atomically."""
    if url == STDOUT:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    _write_atomic(url, data, options)


def _write_atomic(url: str, data: bytes, options: dict[str, Any] | None) -> None:
    remove_dead_writers_temps([url])  # a killed earlier run's temp of this file (tools.output_temps)
    out = open_atomic(url, so.options_for(url, options), tag=writer_tag())
    try:
        out.write(data)
    except BaseException:
        out.abort()
        raise
    out.commit()


# ------------------------------------------------------------------------------------------------
# tsv


MAX_CHARS = 65536  # characters of one cell unless --max-chars says otherwise
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _capped(value: Any, limit: int) -> Any:
    """`value` with text longer than `limit` characters cut, saying how much was left out (a structure
    whose JSON is that long becomes the cut JSON text)."""
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
        return value if len(text) <= limit else _capped(text, limit)
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}...[{len(value) - limit} more characters]"
    return value


def neutralise(cell: str) -> str:
    """A csv cell a spreadsheet will not run as a formula: `'` before a leading = + - @ tab CR, unless
    the cell is a plain number (-1.5 stays a number)."""
    if cell.startswith(_FORMULA_START) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def _row(sample: dict[str, Any], fields: tuple[str, ...], on_error: str, max_chars: int = MAX_CHARS) -> dict[str, Any]:
    row = {"key": _capped(sample["__key__"], max_chars), "url": sample["__url__"]}
    for name in fields:
        try:
            row[name] = _capped(field_value(sample, name), max_chars)
        except FieldError as exc:
            error = ShardflowError(str(exc), url=sample["__url__"], key=sample["__key__"])
            if on_error == "raise":
                raise error from None
            _warn(error)
            row[name] = None
    return row


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# A TSV cell cannot hold a tab or a line break: they are written as \t, \n, \r, and a backslash as \\, so
# every cell reads back exactly (the "linear TSV" convention of PostgreSQL's COPY). Nothing else is
# touched: a caption's emoji joiners, right-to-left marks and soft hyphens stay what they are. Escaping
# for a terminal (controls and format characters as \xNN) comes on top, on a terminal only.
_TSV_CELL = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_cell(text: str, terminal: bool) -> str:
    """One cell of tsv output: lossless (see _TSV_CELL), and escaped for a terminal when it is one."""
    cell = text.translate(_TSV_CELL)
    return printable(cell) if terminal else cell


def _text_table(rows: list[dict[str, Any]], columns: list[str], fmt: str, header: bool, escape: bool,
                raw: bool = False) -> str:
    """`escape`: the text goes to a terminal (controls and format characters escaped)."""
    out = io.StringIO()
    if fmt == "tsv":
        lines = ([columns] if header else []) + [[tsv_cell(_cell(r[c]), escape) for c in columns] for r in rows]
        return "".join("\t".join(line) + "\n" for line in lines)
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        if header:
            writer.writerow(columns)
        for r in rows:
            cells = [printable(_cell(r[c])) if escape else _cell(r[c]) for c in columns]
            writer.writerow(cells if raw else [neutralise(cell) for cell in cells])
        return out.getvalue()
    return "".join(json.dumps({c: r[c] for c in columns}) + "\n" for r in rows)  # jsonl: ASCII, escaped


def _parquet(rows: list[dict[str, Any]], columns: list[str]) -> bytes:
    pa, pq = _pyarrow()
    data = {c: [r[c] for r in rows] for c in columns}
    arrays = {}
    for name, values in data.items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: text (JSON for structures)
            arrays[name] = pa.array([None if v is None else _cell(v) for v in values], type=pa.string())
    out = io.BytesIO()
    pq.write_table(pa.table(arrays), out)
    return out.getvalue()


def _pyarrow() -> tuple[Any, Any]:
    """pyarrow and pyarrow.parquet, or the one-line error that names the extra installing them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise Fail(f"--format parquet needs pyarrow, which is not installed ({exc}): install the `tables` extra, "
                   "pip install -c constraints.txt '.[tables]' in a checkout (or pip install pyarrow)") from None
    return pa, pq


@click.command("tsv")
@spec_inputs
@click.option("--field", "-f", "fields", multiple=True, metavar="FIELD",
              help="a column: a member (cls, txt) or a dotted path into JSON (json.label, json.box.0); repeatable")
@click.option("--format", "fmt", type=click.Choice(["tsv", "csv", "jsonl", "parquet"]), default="tsv",
              show_default=True)
@click.option("--output", "-o", "output", metavar="FILE", help="write here (atomic) instead of stdout; "
              "needed for parquet ('-': standard output, to pipe it)")
@click.option("--header/--no-header", default=True, show_default=True, help="a first line naming the columns")
@click.option("--on-error", type=click.Choice(["raise", "skip"]), default=DEFAULT_ON_ERROR_READ, show_default=True)
@click.option("--max-chars", type=click.IntRange(min=16), default=MAX_CHARS, show_default=True,
              help="cut a cell longer than this many characters (saying how many were left out)")
@click.option("--raw-cells", is_flag=True, help="csv: write cells starting with = + - @ as they are (by default "
              "they get a leading ' so a spreadsheet does not run them as formulas)")
@progress_option
@allow_pipe_option
@storage_option
def tsv_command(spec: tuple[str, ...], fields: tuple[str, ...], fmt: str, output: str | None, header: bool,
                on_error: str, max_chars: int, raw_cells: bool, progress: bool | None, allow_pipe: bool,
                storage_option: tuple[str, ...]) -> None:
    """One line per sample: key, url and the named fields (tar2tsv), as tsv, csv, jsonl or parquet.

    Members that are not text or JSON give their size in bytes. Text output to a terminal is
    escaped (control characters as \\xNN); tsv writes tabs, line breaks and backslashes in values as
    \\t, \\n, \\r and \\\\ (lossless: anything else, emoji and right-to-left text too, as it is). Cells are
    cut at --max-chars; csv cells that would run as spreadsheet formulas get a leading ' (--raw-cells).
    Parquet needs pyarrow (the `tables` extra).

    \b
      shardflow tsv 'data/*.tar' -f cls -f json.label > labels.tsv
      shardflow tsv 'data/*.tar' -f json.caption --format parquet -o meta.parquet
    """
    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet writes a file: give -o FILE (or -o - to pipe it)")
    if output == STDOUT and fmt != "parquet":
        output = None  # `-` is standard output, as for every command (tools.runner.STDOUT): the streamed table
    if output == STDOUT:
        _refuse_binary_to_terminal("parquet")
    if fmt == "parquet":
        _pyarrow()  # before reading anything
    options = parse_storage_options(storage_option)
    columns = ["key", "url", *fields]
    bar = progress_bar(progress, None, "sample")
    with one_line_errors(options, exit_code=EXIT_FAILED, broken_pipe_ok=True):
        urls = expand_all(spec, options)
        if output is not None:
            refuse_input_as_output(output, urls)
        if output is None:
            terminal = sys.stdout.isatty()
            for sample in _samples(urls, options, allow_pipe, on_error):
                row = _row(sample, fields, on_error, max_chars)
                sys.stdout.write(_text_table([row], columns, fmt, header, escape=terminal, raw=raw_cells))
                header = False
                bar.update(1)
            sys.stdout.flush()
            bar.close()
            return
        rows = []
        for sample in _samples(urls, options, allow_pipe, on_error):
            rows.append(_row(sample, fields, on_error, max_chars))
            bar.update(1)
        bar.close()
        if fmt == "parquet":
            data = _parquet(rows, columns)
        else:
            data = _text_table(rows, columns, fmt, header, False, raw_cells).encode()
        _write_out(output, data, options)
    click.echo(f"{len(rows)} rows written to {_shown(output)}", err=True)


# ------------------------------------------------------------------------------------------------
# show


@click.command("show")
@spec_inputs
@click.option("-n", "count", type=click.IntRange(min=1, max=10_000), default=16, show_default=True,
              help="samples with an image to show")
@click.option("--output", "-o", "output", metavar="FILE.png", help="write the contact sheet here (atomic; '-': "
              "the PNG alone to standard output)")
@click.option("--columns", "-c", type=click.IntRange(min=1), default=4, show_default=True, help="tiles per row")
@click.option("--size", type=click.IntRange(16, 2048), default=192, show_default=True, help="tile size in pixels")
@click.option("--image", "image_ext", metavar="EXT", help="the member to show (default: the first image member)")
@click.option("--label", "label_field", metavar="FIELD", help="the label under the key (default: cls, else json.label)")
@allow_pipe_option
@storage_option
def show_command(spec: tuple[str, ...], count: int, output: str | None, columns: int, size: int,
                 image_ext: str | None, label_field: str | None, allow_pipe: bool,
                 storage_option: tuple[str, ...]) -> None:
    """A contact sheet of the images of the first N samples, with their keys and labels (tarshow).

    Shown inline on terminals that can (kitty, iTerm2, WezTerm, sixel terminals), else printed as a text table; with
    -o also written as a PNG. Samples without an image are skipped.

    \b
      shardflow show 'data/train-000000.tar' -n 16 -o sheet.png
    """
    from shardflow.cli import tools_sheet as inline
    from shardflow.tools import sheet

    if output == STDOUT:  # the PNG alone goes to stdout (no inline image, no table)
        _refuse_binary_to_terminal("a PNG")
    options = parse_storage_options(storage_option)
    with one_line_errors(options, exit_code=EXIT_FAILED, broken_pipe_ok=True):
        urls = expand_all(spec, options)
        if output:
            refuse_input_as_output(output, urls)
        tiles = _tiles(urls, options, allow_pipe, count, image_ext, label_field)
        if not tiles:
            raise Fail("no sample with an image member" + (f" {image_ext!r}" if image_ext else ""), EXIT_FAILED)
        image = sheet.render(tiles, columns, size)
        if output:
            _write_out(output, sheet.png_bytes(image), options)
        protocol = inline.inline_protocol(sys.stdout) if output != STDOUT else None  # -o -: stdout holds the PNG
        if protocol:
            sys.stdout.buffer.write(inline.inline_image(image, protocol))
            sys.stdout.flush()
        elif output != STDOUT:
            for tile in tiles:
                click.echo(f"{printable(tile.key)}\t{tile.ext}\t{tile.width}x{tile.height}\t{printable(tile.label)}")
    if output:
        click.echo(f"{len(tiles)} tiles written to {_shown(output)}", err=True)


def _tiles(urls: list[str], options: dict[str, Any] | None, allow_pipe: bool, count: int, image_ext: str | None,
           label_field: str | None) -> list[Any]:
    from shardflow.tools.sheet import Tile, image_member

    tiles = []
    for sample in _samples(urls, options, allow_pipe, "raise"):
        ext = image_member(sample, image_ext)
        if ext is None:
            continue
        tiles.append(Tile(sample["__key__"], _label(sample, label_field), ext, sample[ext]))
        if len(tiles) >= count:
            break
    return tiles


def _label(sample: dict[str, Any], field: str | None) -> str:
    for name in (field,) if field else ("cls", "json.label"):
        try:
            value = field_value(sample, name)
        except FieldError:
            value = None
        if value is not None:
            return _cell(value)
    return ""
