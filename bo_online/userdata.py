r"""A user's own data as a stream (streaming loop) or a pool (active learning).

Files: ``.csv`` / ``.csv.gz`` (UTF-8, comma separated; a first row with any non-numeric cell is a
header of column names) or ``.npz`` (either arrays ``X`` (``n x d``, or ``n`` for one input) and
``y`` (``n`` or ``n x 1``), with an optional ``test_mask`` (``n``), or one ``n x k`` array, named
``data`` or the only array).

Everything is checked before a loop is built: every cell must be a finite number, every row as
long as the header; the first offending cell is reported in one line naming the file, the line
and the column (:class:`DataFileError`, a ``ValueError``).

Problems built here are scaled like the shipped sets: the loops map the data's bounding box to the
unit cube, and the surrogates standardise targets internally. Their ``spec`` records the file's
absolute path and SHA-256, so a run resumes only on the very same file (a changed file is refused,
:class:`DataChangedError`).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import math
import os
import shlex
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bo_online.models.validation import max_abs_output
from bo_online.problems import PoolProblem, StreamProblem, _data_bounds, stream_arrays

__all__ = [
    "DataFileError",
    "DataChangedError",
    "Table",
    "read_table",
    "file_sha256",
    "stream_from_file",
    "pool_from_file",
    "problem_from_spec",
]

SUFFIXES = (".csv", ".csv.gz", ".npz")


class DataFileError(ValueError):
    """A user data file cannot be used; the message names the file, line and column."""


class DataChangedError(ValueError):
    """A run's data file differs from the one the run started on."""


#: the end of a message on a file whose fields are separated by ';' or tabs (European Excel's
#: CSV, with decimal commas that split each row into more fields than its header's one)
_SEPARATOR_ADVICE = (
    "; fields must be separated by commas: save a file that uses ';' or tabs as "
    "comma-separated CSV, with '.' as the decimal point."
)

#: how the message of a non-numeric cell ends; :meth:`Table.require` adds advice for its role
_NOT_A_NUMBER = " is not a number;"


@dataclass
class Table:
    r"""A numeric table read from a file.

    Attributes:
        data: ``n x k`` float64 values.
        columns: the ``k`` column names (``"0"``, ``"1"``, ... when the file has no header).
        path: the file.
        first_line: file line number of ``data[0]`` (1-based; 2 with a header). For ``.npz``: 0.
        mask: an ``n`` test mask stored in an ``.npz`` file, else None.
        lines: file line of each data row (CSV; None for ``.npz``).
    """

    data: np.ndarray
    columns: list[str]
    path: Path
    first_line: int
    mask: np.ndarray | None = None
    lines: list[int] | None = None
    #: column index -> (file line, message) of its first non-numeric or missing cell; checked
    #: only for the columns a run uses (:meth:`require`), so an unused ID column does no harm
    problems: dict[int, tuple[int, str]] = field(default_factory=dict)
    #: column index -> its ``n`` stripped cells, for each CSV column holding a cell that is not
    #: a number (class labels such as ``yes`` / ``no`` for a classification target)
    text: dict[int, list[str]] = field(default_factory=dict)
    #: reads ``lines`` when first needed, for a table read without them (the fast CSV path)
    lines_reader: Callable[[], list[int]] | None = field(default=None, repr=False)
    #: a classification target's two labels as the file holds them, in the order mapped to 0 / 1
    #: (set by :func:`_labels`; for messages)
    classes: tuple[Any, Any] | None = None

    def require(self, columns: Sequence[int], what: str = "an input") -> None:
        """Raise for the first bad cell (in file order) of the given columns, used as ``what``."""
        # file order: by line, then by column (not by message text, which put a column
        # named 'cat' before one named 'id' to its left)
        found = [(self.problems[j][0], j) for j in set(columns) if j in self.problems]
        if found:
            line, column = min(found)
            message = self.problems[column][1]
            if message.endswith(_NOT_A_NUMBER) and self._holds_no_number(line):
                message += (
                    f" line {line} holds no number in any column, as a second header row (of "
                    "units, say) or a header repeated where files were joined does: delete "
                    "that line."
                )
            elif message.endswith(_NOT_A_NUMBER) and self._cell_is_missing(line, column):
                # R's write.csv writes NA for a missing value: no text to encode
                message += " it marks a missing value: drop or fill the rows with missing values."
            elif message.endswith(_NOT_A_NUMBER):
                message += {
                    "the target": " a regression target must be numeric (class labels: pass "
                    "--task classification).",
                    "a pool's target": " the target of a pool must be numeric.",
                    "the test mask": " the test mask must hold 0 or 1 in every row.",
                }.get(
                    what,
                    " only numeric columns can be used (encode this column, or leave it out "
                    "with --inputs).",
                )
            raise DataFileError(message)

    def _cell_is_missing(self, line: int, column: int) -> bool:
        """Whether the text cell of CSV ``line`` in ``column`` is a missing-value marker
        (``NA``, ``N/A``, ``null``, ...)."""
        if self.lines is None or line not in self.lines or column not in self.text:
            return False
        return self.text[column][self.lines.index(line)].lower() in _MISSING_MARKERS

    def _holds_no_number(self, line: int) -> bool:
        """Whether CSV ``line`` (a data row of two or more cells) holds text in every cell, none
        of them a number, empty or a missing-value marker: a header row, not a row of data."""
        if self.lines is None or line not in self.lines or len(self.columns) < 2:
            return False
        row = self.lines.index(line)
        return all(
            j in self.text
            and self.text[j][row]
            and not _is_number(self.text[j][row])
            and self.text[j][row].lower() not in _MISSING_MARKERS
            for j in range(len(self.columns))
        )

    def where(self, row: int) -> str:
        """Where data row ``row`` is in the file: its line (CSV) or its 0-based row (``.npz``)."""
        if self.lines is None and self.lines_reader is not None:
            self.lines = self.lines_reader()
        return f"row {row} (0-based)" if self.lines is None else f"line {self.lines[row]}"

    def column(self, key: str | int, what: str) -> int:
        """Index of a column given by name or (possibly negative) position."""
        index = self._index(key, what)
        self.require([index], what)
        return index

    def _index(self, key: str | int, what: str) -> int:
        if isinstance(key, str) and key not in self.columns and key.strip() in self.columns:
            key = key.strip()  # the header's names are read stripped (``--target " y"``)
        if isinstance(key, str) and key in self.columns:
            if self.columns.count(key) > 1:
                raise DataFileError(
                    f"{self.path}: the header names column {key!r} {self.columns.count(key)} "
                    f"times, so {what} {key!r} is ambiguous; rename the columns or give a "
                    "column index."
                )
            return self.columns.index(key)
        try:
            index = int(key)
        except (TypeError, ValueError):
            # --inputs is split at commas, so a name holding one arrives in pieces: name the
            # column it came from and its index, which --inputs can give
            split = [
                j
                for j, name in enumerate(self.columns)
                if "," in name and str(key).strip() in [p.strip() for p in name.split(",")]
            ]
            hint = "".join(
                f"; column {self.columns[j]!r} holds a comma, at which --inputs splits its "
                f"names: give it by its index, {j}"
                for j in split[:1]
            )
            shown = ", ".join(repr(c) if "," in c else c for c in self.columns)
            raise DataFileError(
                f"{self.path}: no column {key!r} for {what}; columns are {shown}{hint}."
            ) from None
        k = len(self.columns)
        if not -k <= index < k:
            raise DataFileError(
                f"{self.path}: {what} column index {index} is out of range for {k} columns."
            )
        return index % k


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return suffix
    raise DataFileError(f"{path}: unsupported file type; give a .csv, .csv.gz or .npz file.")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_csv(path: Path, gz: bool) -> Table:
    r"""The table of a CSV file: by :func:`_read_numeric_csv` where every cell is a finite
    number, else cell by cell here, to name the first bad cell of each column (numpy's reader
    only says that one failed) and keep text columns (class labels)."""
    opener = gzip.open if gz else open
    fast = _read_numeric_csv(path, opener)
    if fast is not None:
        return fast
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:  # Excel's BOM
            rows = _records(f)
    except UnicodeDecodeError as e:  # its position is in a read buffer: find the line
        raise DataFileError(_not_utf8(path, opener)) from e
    except (EOFError, zlib.error) as e:  # gzip's own errors (a BadGzipFile is an OSError)
        raise DataFileError(
            f"{path}: the compressed file is damaged or incomplete ({e}); copy or download it "
            "again (gzip -t tests it)."
        ) from e
    except (OSError, csv.Error) as e:
        raise DataFileError(f"{path}: cannot be read as CSV ({e}).") from e
    if not rows:
        raise DataFileError(f"{path}: the file holds no rows.")
    # A comma at the end of every line (as some spreadsheet exports write) is no empty column.
    while all(len(row) > 1 and not row[-1].strip() for _, row in rows):
        rows = [(line, row[:-1]) for line, row in rows]
    line0, first = rows[0]
    has_header = _is_header(first, rows[1][1] if len(rows) > 1 else [])
    columns = _column_names(first, has_header)
    body = rows[1:] if has_header else rows
    if not body:
        raise DataFileError(f"{path}: the file holds a header but no data rows.")
    k = len(columns)
    data = np.empty((len(body), k), dtype=np.float64)
    problems: dict[int, tuple[int, str]] = {}
    for r, (line, row) in enumerate(body):
        if len(row) != k:
            advice = "."
            if k == 1 and any(c in first[0] for c in ";\t"):
                advice = _SEPARATOR_ADVICE
            elif r == 0 and len(row) > k:  # fewer fields above the rows: no header
                advice = (
                    f"; if line {line0} is a title or comment above the column names, delete it."
                )
            raise DataFileError(
                f"{path}: line {line} has {len(row)} fields, expected {k} (as in line {line0})"
                + advice
            )
        for j, cell in enumerate(row):
            text = cell.strip()
            try:
                value = float(text) if text else math.nan
            except ValueError:
                value = math.nan
                if j not in problems:  # the message of a column's first bad cell only
                    problems[j] = (
                        line,
                        (
                            f"{path}: line {line}, column {columns[j]!r} (no. {j + 1}): "
                            f"{text!r}{_NOT_A_NUMBER}"
                        ),
                    )
            if not math.isfinite(value) and j not in problems:
                problems[j] = (
                    line,
                    (
                        f"{path}: line {line}, column {columns[j]!r} (no. {j + 1}) is "
                        f"{text or 'empty'}; "
                        f"drop or fill the rows with missing values."
                    ),
                )
            data[r, j] = value
    lines = [line for line, _ in body]
    text = {
        j: [row[j].strip() for _, row in body]
        for j, (_, message) in problems.items()
        if message.endswith(_NOT_A_NUMBER)
    }
    return Table(data, columns, path, body[0][0], lines=lines, problems=problems, text=text)


def _is_header(first: list[str], second: list[str]) -> bool:
    r"""Whether a CSV's first record ``first`` is a header (``second``: the next record).

    A header has a cell that is not a number; an empty cell says nothing (a data row with a
    missing value is reported as such, not taken for a header), except as the first cell of a
    row of whole numbers: pandas' ``to_csv`` header (unnamed index, default column names 0, 1,
    ...)."""
    header = [c.strip() for c in first]
    pandas_index_header = (
        len(header) > 2  # an index and at least two columns ("',0'" may be a data row)
        and header[0] == ""
        and all(c.isascii() and c.isdecimal() for c in header[1:])
        and [int(c) for c in header[1:]] == list(range(len(header) - 1))
        and bool(second)
        and second[0].strip() == "0"  # pandas' default index starts at 0
    )
    return pandas_index_header or not all(_is_number(c) for c in header if c)


def _column_names(first: list[str], has_header: bool) -> list[str]:
    """The columns' names: the header's cells, or ``"0"``, ``"1"``, ... without a header."""
    return [c.strip() for c in first] if has_header else [str(j) for j in range(len(first))]


def _read_numeric_csv(path: Path, opener: Any) -> Table | None:
    r"""The table of a CSV whose every data cell is a finite number, read by numpy's C reader
    (about 10x faster than cell by cell, with a tenth of the memory: a user's file may hold
    millions of rows); None for any other file (a text or empty cell, a short row, a header
    over several lines, trailing commas, not UTF-8, ...), which :func:`_read_csv` reads cell
    by cell to report what is wrong. Both give the same table: numpy's float parsing is
    correctly rounded, as Python's ``float`` is. The file lines of the rows, needed only for
    messages, are read when first asked for."""
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            first = next(reader, None)
            header_end = reader.line_num
            second = next(reader, None)
        if not first or not second or not any(c.strip() for c in first):
            return None  # blank or empty leading lines: the careful reader numbers them
        has_header = _is_header(first, second)
        if has_header and header_end != 1:
            return None  # a header over several lines (a quoted line break)
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            data = np.loadtxt(
                f,
                delimiter=",",
                quotechar='"',
                comments=None,
                skiprows=1 if has_header else 0,
                dtype=np.float64,
                ndmin=2,
            )
    except (ValueError, OSError, csv.Error, UnicodeDecodeError, EOFError, zlib.error):
        return None
    if data.shape[0] == 0 or data.shape[1] != len(first) or not np.isfinite(data).all():
        return None
    columns = _column_names(first, has_header)

    def lines() -> list[int]:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            records = _records(f)
        return [line for line, _ in records[1 if has_header else 0 :]]

    return Table(data, columns, path, 2 if has_header else 1, lines_reader=lines)


def _records(f: Any) -> list[tuple[int, list[str]]]:
    """The non-blank CSV records of text file ``f``, each with the file line it starts on (a
    quoted field may hold line breaks, so records and lines are not counted alike)."""
    reader = csv.reader(f)
    rows, start = [], 1
    for row in reader:
        if any(c.strip() for c in row):
            rows.append((start, row))
        start = reader.line_num + 1
    return rows


def _not_utf8(path: Path, opener: Any) -> str:
    """The message for a CSV that is not UTF-8 text (Latin-1, Windows-1252, ...), naming the
    first line that does not decode and the byte."""
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # a UTF-16 byte-order mark (Excel's Unicode text)
        return (
            f"{path}: is UTF-16 text (it starts with a UTF-16 byte-order mark); save the file "
            "as UTF-8 (Excel: 'CSV UTF-8'; or iconv -f utf-16 -t utf-8)."
        )
    lines = raw.splitlines()
    for number, line in enumerate(lines, 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            where = f"line {number} is not UTF-8 text (byte 0x{line[e.start]:02x})"
            break
    else:
        where = "is not UTF-8 text"
    return (
        f"{path}: {where}; save the file as UTF-8 (Excel: 'CSV UTF-8'; or iconv -f latin1 -t "
        "utf-8)."
    )


def _read_npz(path: Path, vector: bool = False) -> Table:
    """An ``.npz`` file as a table; with ``vector``, one array of ``n`` values (a mask file)
    is one column."""
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataFileError(f"{path}: cannot be read as .npz ({e}).") from e
    if not isinstance(npz, np.lib.npyio.NpzFile):  # an .npy or pickle under an .npz name
        raise DataFileError(f"{path}: is not an .npz archive (np.savez writes one).")
    arrays = {}
    with npz:
        for key in npz.files:
            try:
                arrays[key] = npz[key]
            except ValueError as e:  # an array of Python objects: read only by unpickling
                if "allow_pickle" not in str(e):
                    raise DataFileError(f"{path}: cannot be read as .npz ({e}).") from e
                raise DataFileError(
                    f"{path}: array {key!r} holds Python objects (dtype object: text mixed with "
                    "numbers or None, say), which are not read from an .npz; save numbers (two "
                    "class labels as 0 / 1, a missing value as nan), or write the data as a "
                    "CSV, whose text labels --task classification reads."
                ) from e
    mask = None
    if "X" in arrays and "y" in arrays:
        X, y = np.asarray(arrays["X"]), np.asarray(arrays["y"])
        if X.ndim == 1:  # n values of one input, as y may be n or n x 1
            X = X[:, None]
        if X.ndim != 2 or y.size != X.shape[0] or y.size not in y.shape:
            raise DataFileError(
                f"{path}: X must be n x d (or n values of one input) and y hold n values (n or "
                f"n x 1), got X {np.asarray(arrays['X']).shape} and y {y.shape}; save them so."
            )
        y = y.reshape(-1)
        if y.dtype.kind in "USO" or X.dtype.kind in "USO":  # text, as class labels are written
            name, array = ("y", y) if y.dtype.kind in "USO" else ("X", X)
            raise DataFileError(
                f"{path}: array {name} holds text (dtype {array.dtype}), and an .npz must hold "
                "numbers"
                + (
                    "; save two class labels as 0 / 1 (e.g. (y == 'yes').astype(float)), or "
                    "write the data as a CSV, whose text labels --task classification reads."
                    if name == "y"
                    else "; encode the text inputs as numbers."
                )
            )
        data = np.column_stack([X, y])
        columns = [f"x{j}" for j in range(X.shape[1])] + ["y"]
        if "test_mask" in arrays:
            mask = np.asarray(arrays["test_mask"]).reshape(-1)
            if mask.shape[0] != X.shape[0]:
                raise DataFileError(
                    f"{path}: test_mask holds {mask.shape[0]} values for {X.shape[0]} rows."
                )
    else:
        name = "data" if "data" in arrays else (next(iter(arrays)) if len(arrays) == 1 else None)
        if name is None:
            raise DataFileError(
                f"{path}: expected arrays X and y, or one array 'data'; found {sorted(arrays)}: "
                "save the inputs as X (n x d) and the target as y (np.savez(path, X=..., "
                "y=...)), or every column in one n x k array named data."
            )
        data = np.asarray(arrays[name])
        if vector and data.ndim == 1:
            data = data[:, None]
        if data.ndim != 2:
            raise DataFileError(f"{path}: array {name!r} must be n x k, got shape {data.shape}.")
        columns = [str(j) for j in range(data.shape[1])]
    if data.dtype != bool and not np.issubdtype(data.dtype, np.number):
        raise DataFileError(f"{path}: arrays must be numeric, got dtype {data.dtype}.")
    if np.iscomplexobj(data):  # astype(float64) would keep the real part, with a warning only
        raise DataFileError(
            f"{path}: arrays must be real, got dtype {data.dtype}; save the real part (or the "
            "absolute value) instead."
        )
    data = data.astype(np.float64)
    # Like a CSV's cells: a missing value counts only in a column the run uses (Table.require).
    problems: dict[int, tuple[int, str]] = {}
    for r, j in np.argwhere(~np.isfinite(data)):
        problems.setdefault(
            int(j),
            (
                int(r),
                f"{path}: row {r} (0-based), column {columns[j]!r} is {data[r, j]}; drop or "
                "fill the rows with missing values.",
            ),
        )
    return Table(data, columns, path, 0, mask, problems=problems)


def read_table(path: str | os.PathLike) -> Table:
    r"""Read and check a ``.csv`` / ``.csv.gz`` / ``.npz`` file (see the module docstring)."""
    path = Path(path).expanduser()
    if path.is_dir():  # whatever its name: a folder is no file type
        raise DataFileError(
            f"{path} is a directory; name the data file in it (.csv, .csv.gz or .npz)."
        )
    suffix = _suffix(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file.")
    table = _read_npz(path) if suffix == ".npz" else _read_csv(path, gz=suffix == ".csv.gz")
    if table.data.shape[1] < 2:
        raise DataFileError(
            f"{path}: needs at least one input column and one target column, got "
            f"{table.data.shape[1]} column(s) (fields must be separated by commas: save a "
            "file that uses ';' or tabs as comma-separated CSV)."
        )
    if suffix != ".npz":
        _warn_numbered_header(table)
    return table


def _whole_numbers_below_the_first_row(table: Table) -> bool:
    r"""Whether every cell below a CSV's first row is a whole number or missing (empty or a
    missing-value marker; a text cell is not a whole number). ``np.array_equal`` alone takes a
    missing cell's NaN for unequal to itself, and ``equal_nan`` alone would take text for a
    whole number."""
    rest = table.data[1:]
    if not np.array_equal(rest, np.round(rest), equal_nan=True):
        return False
    return not any(
        cell and not _is_number(cell) and cell.lower() not in _MISSING_MARKERS
        for cells in table.text.values()
        for cell in cells[1:]
    )


def _warn_numbered_header(table: Table) -> None:
    r"""Warn where a CSV's first row, read as data (no cell of it is text), is ``0, 1, ...,
    k - 1`` above rows that are not all whole numbers: most likely the header pandas'
    ``to_csv(index=False)`` writes for a data frame of unnamed columns, which silently became
    one more data row (a target of ``k - 1`` at inputs ``0, 1, ...``)."""
    data, k = table.data, table.data.shape[1]
    if (
        table.columns != [str(j) for j in range(k)]  # a header was found
        or data.shape[0] < 2
        or not np.array_equal(data[0], np.arange(k))
        or _whole_numbers_below_the_first_row(table)  # then 0, 1, ... may be data
    ):
        return
    warnings.warn(
        f"{table.path}: its first row ({', '.join(map(str, range(k)))}) is read as data, as a "
        "header needs a cell that is not a number; if it is a header of column numbers "
        "(pandas' to_csv(index=False) of a data frame with unnamed columns), name the columns "
        "(e.g. x0, x1, ..., y) or delete that line.",
        UserWarning,
        stacklevel=2,
    )


def _test_mask(
    table: Table,
    test_mask: str | int | None,
    test_fraction: float | None,
    seed: int,
) -> tuple[np.ndarray, int | None]:
    """The test rows (boolean ``n``) and the mask column used (excluded from the inputs)."""
    n = table.data.shape[0]
    if test_mask is not None:
        if isinstance(test_mask, str) and not test_mask.strip() and test_mask not in table.columns:
            raise DataFileError(
                f"The test mask is empty; give a 0/1 column of {table.path} or a file with one "
                "0/1 column (or leave it out and use the test fraction)."
            )
        if (
            isinstance(test_mask, str)
            and test_mask not in table.columns
            and Path(test_mask).expanduser().is_dir()
        ):
            raise DataFileError(
                f"{test_mask} is a directory; name the test-mask file in it (.csv, .csv.gz or "
                ".npz)."
            )
        if _names_a_missing_file(table, test_mask):
            raise DataFileError(
                f"{test_mask}: no such file (given as the test mask; it names no column of "
                f"{table.path} either)."
            )
        mask_file = _mask_file(table, test_mask)
        if mask_file is not None:
            mask_table = read_table_any(mask_file)
            mask_table.require([mask_table.data.shape[1] - 1], "the test mask")
            values = (
                mask_table.data[:, -1] if mask_table.data.shape[1] > 1 else mask_table.data[:, 0]
            )
            if values.shape[0] != n:
                raise DataFileError(
                    f"{mask_table.path}: the test mask holds {values.shape[0]} rows, but "
                    f"{table.path} holds {n}."
                )
            column, source = None, f"{mask_table.path}"
        else:
            column = table.column(test_mask, "the test mask")
            values = table.data[:, column]
            source = f"column {table.columns[column]!r} of {table.path}"
        mask = _zero_one(values, mask_table if mask_file is not None else table, source)
    elif table.mask is not None and test_fraction is None:
        source = f"{table.path}'s test_mask array"
        mask, column = _zero_one(table.mask, table, source), None
    else:
        fraction = 0.1 if test_fraction is None else float(test_fraction)
        if not 0.0 < fraction < 1.0:
            raise DataFileError(f"test fraction must be in (0, 1), got {fraction}.")
        k = int(round(fraction * n))
        if n < 2:
            raise DataFileError(
                f"{table.path}: holds {n} data row; a run needs at least 2 (one to learn from, "
                "one to test on)."
            )
        if not 1 <= k < n:
            raise DataFileError(
                f"{table.path}: a test fraction of {fraction} of its {n} rows leaves no test row "
                f"or no training row; give a test fraction (--test-fraction) from {1 / n:.3g} to "
                f"{(n - 1) / n:.3g}, or mark the test rows (--test-mask)."
            )
        mask = np.zeros(n, bool)
        mask[np.random.default_rng(seed).permutation(n)[:k]] = True
        column = None
    if mask.all():
        raise DataFileError(
            f"The test mask ({source}) marks all {n} rows of {table.path} as test rows, leaving "
            "none to learn from; mark only the held-out rows with 1."
        )
    if not mask.any():
        instead = (  # an .npz file's array stays in the file: a test fraction overrides it
            "give a test fraction (--test-fraction), which ignores the array"
            if test_mask is None
            else "leave the mask out: a random tenth is held out"
        )
        raise DataFileError(
            f"The test mask ({source}) marks none of the {n} rows of {table.path} as a test "
            f"row; mark the held-out rows with 1 (or {instead})."
        )
    return mask, column


def _zero_one(values: np.ndarray, table: Any, source: str) -> np.ndarray:
    """A test mask's values (``n``, rows of ``table``, read from ``source``) as booleans,
    refusing anything but 0/1 (and booleans), with the first other value and where it is: a mask
    file's bad value was reported as the data file's, without the value."""
    if values.dtype != bool and not (
        np.issubdtype(values.dtype, np.number) and np.isin(values, (0, 1)).all()
    ):
        bad = np.flatnonzero(~np.isin(values, (0, 1)))
        first = (
            f"; {table.where(int(bad[0]))} holds {values[bad[0]].item():g}"
            if np.issubdtype(values.dtype, np.number) and bad.size
            else ""
        )
        raise DataFileError(f"The test mask ({source}) must hold 0/1 values (1 = test row){first}.")
    return values.astype(bool)


def _mask_file(table: Table, test_mask: str | int | None) -> Path | None:
    """The file ``test_mask`` names, or None where it names a column of the data file (a column
    wins over a file of the same name in the working directory, which a resume from elsewhere
    would otherwise read instead) or no existing file."""
    if not isinstance(test_mask, str) or test_mask in table.columns:
        return None
    path = Path(test_mask).expanduser()
    return path if path.is_file() else None


def _names_a_missing_file(table: Table, test_mask: str | int) -> bool:
    """Whether ``test_mask`` reads as a file name (a path separator or a data-file suffix) that
    names neither an existing file nor a column of ``table``."""
    if not isinstance(test_mask, str) or test_mask in table.columns:
        return False
    looks_like_path = (
        "/" in test_mask or os.sep in test_mask or test_mask.lower().endswith(SUFFIXES)
    )
    return looks_like_path and not Path(test_mask).expanduser().is_file()


def read_table_any(path: Path) -> Table:
    """A mask file: like :func:`read_table`, but a single column is allowed."""
    suffix = _suffix(path)
    if suffix == ".npz":
        return _read_npz(path, vector=True)
    return _read_csv(path, gz=suffix == ".csv.gz")


def _is_row_index(table: Table) -> bool:
    """Whether the first column is a row index that a data frame library wrote: named ``""``
    in a header (pandas' ``to_csv``, R's ``write.csv``) or ``"Unnamed: 0"`` (such a file read
    by pandas and written again), holding ``0, 1, 2, ...`` or ``1, 2, 3, ...``. A row number
    says nothing about the target, so it is no default input."""
    if table.columns[0] not in ("", "Unnamed: 0") or table.first_line < 2:  # a header's name
        return False
    rows = np.arange(table.data.shape[0])
    return any(np.array_equal(table.data[:, 0], rows + start) for start in (0, 1))


#: Header names of a column that identifies rows (compared in lower case, without spaces,
#: ``_``, ``-`` and ``.``: ``ID``, ``row_id``, ``Row No.``): no input by default
#: (:func:`_inputs`).
_IDENTIFIER_NAMES = frozenset(
    {"id", "ids", "index", "idx", "row", "rowid", "rowindex", "rownumber", "rownum", "rowno"}
)

#: rows from which a column of distinct consecutive integers is warned of as a likely row
#: number (in a few rows, integer levels 1, 2, 3 of a real input are as likely)
_CONSECUTIVE_MIN_ROWS = 10


def _is_identifier_name(name: str) -> bool:
    """Whether a header name says its column identifies rows (``id``, ``ID``, ``index``,
    ``row``, ``row_id``, ...)."""
    key = "".join(c for c in name.lower() if c not in " _-.")
    return key in _IDENTIFIER_NAMES


def _is_unnamed(name: str) -> bool:
    """Whether a header name is none: empty (pandas' ``to_csv`` index, R's ``write.csv`` row
    names) or pandas' ``Unnamed: 0`` (``Unnamed: 3``, ``Unnamed: 0.1``) for an empty one."""
    if name == "":
        return True
    head, _, number = name.partition("Unnamed: ")
    return head == "" and number.replace(".", "", 1).isdecimal()


def _holds_row_numbers(values: np.ndarray) -> bool:
    """Whether ``values`` (``n``) are the row numbers ``0 .. n - 1`` or ``1 .. n`` in any order
    (a data frame's index after its rows were shuffled)."""
    ordered = np.sort(values)
    rows = np.arange(values.shape[0])
    return any(np.array_equal(ordered, rows + start) for start in (0, 1))


def _consecutive_integers(values: np.ndarray) -> bool:
    """Whether ``values`` (``n``, n >= :data:`_CONSECUTIVE_MIN_ROWS`) are ``n`` distinct
    consecutive integers ``k, k + 1, ..., k + n - 1`` in any order."""
    n = values.shape[0]
    if n < _CONSECUTIVE_MIN_ROWS or not np.isfinite(values).all():
        return False
    ordered = np.sort(values)
    return bool(
        np.array_equal(ordered, np.round(ordered))
        and np.array_equal(ordered, ordered[0] + np.arange(n))
    )


def _inputs_option(table: Table, cols: Sequence[int]) -> str:
    """The ``--inputs`` value naming columns ``cols``, as a shell reads it (quoted where a name
    holds a space or another character a shell would split at or expand): each by name, or by
    index where its name cannot be given (empty, holding a comma at which ``--inputs`` splits,
    or shared by several columns, which :meth:`Table.column` refuses as ambiguous); an index
    that is another column's name is given from the end (``-2``)."""
    k = len(table.columns)

    def key(j: int) -> str:
        name = table.columns[j]
        if name and "," not in name and table.columns.count(name) == 1:
            return name
        return str(j) if str(j) not in table.columns else str(j - k)

    return shlex.quote(",".join(key(j) for j in cols))


def _holds_codes(table: Table, column: int) -> bool:
    """Whether ``column`` holds what identifies rows: text codes (``A001``) or whole numbers
    (its missing cells aside). A column of fractions (``1.37``, ``0.52``) measures something,
    whatever its name (a refractive or price ``index``)."""
    if column in table.text:
        return True
    values = table.data[:, column]
    values = values[np.isfinite(values)]
    return bool(np.array_equal(values, np.round(values)))


def _identifier_columns(
    table: Table, cols: list[int], drop_fractional_identifiers: bool = False
) -> list[int]:
    """The columns among the default inputs ``cols`` that identify rows: a name of
    :data:`_IDENTIFIER_NAMES` over text codes or whole numbers (:func:`_holds_codes`; with
    ``drop_fractional_identifiers``, as runs recorded before that check had it, whatever the
    column holds), or no name (:func:`_is_unnamed`) over the row numbers in any order."""
    return [
        j
        for j in cols
        if (
            _is_identifier_name(table.columns[j])
            and (drop_fractional_identifiers or _holds_codes(table, j))
        )
        or (
            _is_unnamed(table.columns[j])
            and table.first_line >= 2  # a header's empty name, not a headerless file's "0"
            and j not in table.problems
            and _holds_row_numbers(table.data[:, j])
        )
    ]


def _names(table: Table, cols: Sequence[int]) -> str:
    """Columns as a message names them: ``'id'``, ``'id' and 'row'``, ``'a', 'b' and 'c'``."""
    shown = [repr(table.columns[j]) for j in cols]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _inputs(
    table: Table,
    inputs: Sequence[str | int] | None,
    exclude: set[int],
    drop_row_index: bool = True,
    drop_identifiers: bool = True,
    drop_fractional_identifiers: bool = False,
) -> list[int]:
    r"""The input columns: ``inputs`` as named (always honoured), else every column not in
    ``exclude`` (target, mask) but row identifiers, where other inputs remain:

    - ``drop_row_index``: a first column of row numbers in file order that a data frame library
      wrote (unnamed or ``Unnamed: 0``), left out with a warning;
    - ``drop_identifiers``: a column named as an identifier (``id``, ``ID``, ``index``,
      ``row``, ``row_id``, ...; :data:`_IDENTIFIER_NAMES`) over text codes or whole numbers
      (``drop_fractional_identifiers``: whatever it holds), or unnamed over the row numbers in
      any order, left out with a warning that names it and how to keep it (``--inputs``).

    A default input of distinct consecutive integers that stays (another name, or the only
    input left) is warned of where other inputs remain, naming the ``--inputs`` that leaves it
    out: the model would fit the row order. Runs recorded before a rule existed pass False for
    it (:func:`problem_from_spec`), so they resume on the inputs they started with."""
    if inputs is None:
        cols = [j for j in range(len(table.columns)) if j not in exclude]
        if drop_row_index and len(cols) > 1 and cols[0] == 0 and _is_row_index(table):
            cols = cols[1:]
            warnings.warn(
                f"{table.path}: the first column ({table.columns[0]!r}) holds the row numbers "
                "(the index pandas' or R's CSV writers add), so it is not used as an input; "
                "write the file without it (pandas: index=False), or name the inputs with "
                "--inputs to choose them yourself.",
                UserWarning,
                stacklevel=4,  # the caller of stream_from_file / pool_from_file
            )
        ids = (
            _identifier_columns(table, cols, drop_fractional_identifiers)
            if drop_identifiers
            else []
        )
        if ids and len(ids) < len(cols):
            kept = [j for j in cols if j not in ids]
            for j in ids:
                why = (
                    "is named as a row identifier"
                    if _is_identifier_name(table.columns[j])
                    else "has no name and holds the row numbers"
                )
                # text (codes such as "A017") is no input; nor are the other text columns,
                # which a suggested --inputs naming them would only see refused
                numeric = [k for k in kept if k not in table.text]
                advice = (
                    "; it holds text, which no model takes as an input"
                    if j in table.text
                    else "; to use it, name it among the inputs: --inputs "
                    f"{_inputs_option(table, sorted(numeric + [j]))}"
                )
                warnings.warn(
                    f"{table.path}: column {table.columns[j]!r} {why}, so it is not used as an "
                    f"input{advice}.",
                    UserWarning,
                    stacklevel=4,
                )
            cols = kept
        elif ids:  # nothing else to learn from: kept, but not silently
            warnings.warn(
                f"{table.path}: input column{'s' if len(ids) > 1 else ''} {_names(table, ids)} "
                f"{'look' if len(ids) > 1 else 'looks'} like a row identifier, but the file "
                "holds no other input, so the model learns the target as a function of the "
                "row order.",
                UserWarning,
                stacklevel=4,
            )
        if len(cols) > 1:  # an input of row numbers under another name: warned of, kept
            for j in cols:
                values = table.data[:, j]
                if j in ids or j in table.problems or not _consecutive_integers(values):
                    continue
                others = [i for i in cols if i != j]
                warnings.warn(
                    f"{table.path}: input column {table.columns[j]!r} holds {len(values)} "
                    f"distinct consecutive integers ({values.min():.0f} .. {values.max():.0f}), "
                    "as a row number or identifier does, and the model would fit the row "
                    "order; if it is not a real input, leave it out with --inputs "
                    f"{_inputs_option(table, others)}.",
                    UserWarning,
                    stacklevel=4,
                )
        # A column of one value tells the model nothing and costs it a dimension (for WISKI
        # a grid dimension, or the additive structure past 3 inputs); kept, but not silently.
        constant = [
            j
            for j in cols
            if j not in table.problems
            and table.data.shape[0] > 1
            and table.data[:, j].max() == table.data[:, j].min()  # no ptp: it overflows
        ]
        varying = [j for j in cols if j not in constant]
        if constant and varying:
            many = len(constant) > 1
            warnings.warn(
                f"{table.path}: input column{'s' if many else ''} {_names(table, constant)} "
                f"hold{'' if many else 's'} one value in every row, which tells the model "
                "nothing but costs it an input dimension; leave "
                f"{'them' if many else 'it'} out with --inputs "
                f"{_inputs_option(table, varying)}.",
                UserWarning,
                stacklevel=4,
            )
        table.require(cols)
    else:
        cols = [table.column(c, "an input") for c in inputs]
        repeated = sorted({table.columns[j] for j in cols if cols.count(j) > 1})
        if repeated:
            raise DataFileError(
                f"{table.path}: input column(s) {', '.join(repeated)} are given more than once."
            )
        clash = [table.columns[j] for j in cols if j in exclude]
        if clash:
            raise DataFileError(
                f"{table.path}: column(s) {', '.join(clash)} cannot be both input and target/mask."
            )
    if not cols:
        raise DataFileError(f"{table.path}: no input columns are left.")
    return cols


#: Text cells that mark a missing value, not a class label (compared stripped, lower case).
_MISSING_MARKERS = frozenset({"nan", "na", "n/a", "null", "none", "?"})


def _labels(table: Table, column: int, train: np.ndarray) -> np.ndarray:
    """Binary class labels of target column ``column`` to {0, 1}, in sorted order: of two
    numbers the smaller is 0, of two text labels the first in character order (``no`` 0,
    ``yes`` 1; capitals sort before lower case, so ``Yes`` 0, ``no`` 1). ``train`` (``n``
    bool) marks the rows the model learns from, which must hold both classes."""
    name = table.columns[column]
    y: np.ndarray = table.data[:, column]
    if column in table.text:  # text labels: every cell must hold one
        cells = table.text[column]
        empty = next((r for r, cell in enumerate(cells) if not cell), None)
        if empty is not None:
            raise DataFileError(
                f"{table.path}: {table.where(empty)}, target column {name!r} is empty; drop or "
                "fill the rows with missing labels."
            )
        y = np.asarray(cells)
    else:
        table.require([column], "the target")
    values = np.unique(y)
    if column in table.text:
        # A missing-value marker among text labels would read as a class: beside two classes
        # as a third, beside one class as the second. Beside three or more real labels the
        # column is not binary whatever the marker means (the check below says so).
        is_marker = np.array([str(v).strip().lower() in _MISSING_MARKERS for v in values])
        if is_marker.any() and (~is_marker).sum() <= 2:
            missing = next(
                r for r, cell in enumerate(y) if cell.strip().lower() in _MISSING_MARKERS
            )
            raise DataFileError(
                f"{table.path}: {table.where(missing)}, target column {name!r} holds "
                f"{str(y[missing])!r}, a missing label; drop or fill the rows with missing labels "
                f"(if {str(y[missing])!r} is a class, give it another name)."
            )
    if values.size != 2:
        shown = ", ".join(_label(v) for v in values[:5]) + (", ..." if values.size > 5 else "")
        advice = "name a column of two classes with --target, or use --task regression."
        if 3 <= values.size <= 5:  # a few classes: their rows, so that a stray one is found
            counts = [int((y == v).sum()) for v in values]
            test_only = [_label(v) for v in values if not (train & (y == v)).any()]
            shown += "; rows: " + ", ".join(map(str, counts))
            # where the rarest class (a stray label, most often) first is: a line to edit
            rarest = values[int(np.argmin(counts))]
            first = int(np.flatnonzero(y == rarest)[0])
            shown += f"; {_label(rarest)} first on {table.where(first)}"
            if test_only:
                shown += f"; {', '.join(test_only)} only in test rows"
            advice = (
                "only two classes are classified: drop or merge the rows of the others, or name "
                "a column of two classes with --target."
            )
        raise DataFileError(
            f"{table.path}: binary classification needs exactly two distinct values in target "
            f"column {name!r}, found {values.size} ({shown}); {advice}"
        )
    seen = np.unique(y[train])
    if seen.size < 2:
        raise DataFileError(
            f"{table.path}: every training row of target column {name!r} holds "
            f"{_label(seen[0])}: the test rows took all of class "
            f"{_label(values[values != seen[0]][0])}; choose another --test-mask, "
            "--test-fraction or --seed."
        )
    table.classes = (values[0], values[1])
    return (y == values[1]).astype(np.float64)


def _label(value: Any) -> str:
    """A class label as the messages and the summary show it: text quoted, a number in full
    (``1000001``, ``0.5``: as ``%g``, codes 1000001 and 1000002 both read ``1e+06``)."""
    if isinstance(value, str):
        return repr(str(value))
    number = float(value)
    if number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return repr(number)


def _spec(kind: str, table: Table, **options: Any) -> dict[str, Any]:
    mask_file = _mask_file(table, options.get("test_mask"))
    if mask_file is not None:  # recorded absolute: the run resumes from any directory
        options["test_mask"] = str(mask_file.resolve())
        options["test_mask_sha256"] = file_sha256(mask_file)
    return {
        "name": "file",
        "kind": kind,
        "path": str(table.path.resolve()),
        "sha256": file_sha256(table.path),
        **options,
    }


def stream_from_file(
    path: str | os.PathLike,
    target: str | int | None = None,
    inputs: Sequence[str | int] | None = None,
    test_fraction: float | None = None,
    test_mask: str | int | os.PathLike | None = None,
    task: str | None = None,
    shuffle: bool = True,
    seed: int = 0,
    max_stream: int | None = None,
    max_test: int | None = None,
    expected_sha256: str | None = None,
    expected_mask_sha256: str | None = None,
    drop_row_index: bool = True,
    drop_identifiers: bool = True,
    drop_fractional_identifiers: bool = False,
) -> StreamProblem:
    r"""A :class:`~bo_online.problems.StreamProblem` from a file.

    Args:
        path: ``.csv`` / ``.csv.gz`` / ``.npz`` file.
        target: target column (name or index; default: the last column that is not the
            ``test_mask`` column).
        inputs: input columns (names or indices; default: every other column but the mask).
        test_fraction: fraction of rows held out at random (seeded; default 0.1, a 90/10 split).
        test_mask: instead, a column of the file, or a file (a path, as a string or
            :class:`~pathlib.Path`) with one 0/1 column, marking test rows.
        task: ``"regression"`` or ``"classification"`` (two distinct target values, numbers or
            text labels, mapped to {0, 1} in sorted order: ``no`` / ``yes`` to 0 / 1). Default
            (None): regression, with a warning where the target holds two distinct values only
            (0/1 labels, say), which names ``--task classification``; an explicit
            ``"regression"`` gives none.
        shuffle: stream the training rows in a seeded random order (else in file order).
        seed: seed of the random test rows (``test_fraction``) and of the stream's order.
        max_stream: keep only the first this many stream rows.
        max_test: keep only the first this many test rows.
        expected_sha256: refuse the file unless its hash is this (used on resume).
        expected_mask_sha256: likewise for a test-mask file.
        drop_row_index: leave out of the default inputs a first column of row numbers that a
            data frame library wrote (unnamed or ``Unnamed: 0``, holding ``0, 1, ...`` or
            ``1, 2, ...``), with a warning, where other inputs remain.
        drop_identifiers: likewise leave out a column named as a row identifier (``id``,
            ``ID``, ``index``, ``row``, ``row_id``, ...) that holds text codes or whole numbers
            (one of fractions, such as a refractive ``index``, is a measurement and stays), and
            an unnamed one holding the row numbers in any order, each with a warning naming it
            and the ``--inputs`` that keeps it. Either way a default input of distinct
            consecutive integers is warned of. ``inputs``, where given, are always used as
            named.
        drop_fractional_identifiers: leave out a column named as a row identifier even where
            it holds fractions, as runs recorded before that check did (set by
            :func:`problem_from_spec` only).
    """
    task_given = task is not None
    task = "regression" if task is None else task
    if task not in ("regression", "classification"):
        raise DataFileError(f"task must be 'regression' or 'classification', got {task!r}.")
    test_mask = _mask_option(test_mask)
    table, X, y, mask = _split_table(
        path,
        target,
        inputs,
        test_fraction,
        test_mask,
        seed,
        expected_sha256,
        expected_mask_sha256,
        drop_row_index,
        drop_identifiers,
        regression=task == "regression",
        drop_fractional_identifiers=drop_fractional_identifiers,
        classifiable=True,
        task_given=task_given,
    )
    X_stream, y_stream, X_test, y_test = stream_arrays(
        X[~mask], y[~mask], X[mask], y[mask], shuffle, seed, max_stream, max_test
    )
    if task == "classification" and max_stream is not None and y_stream.unique().numel() < 2:
        # _labels saw both classes in the training rows; the cut to max_stream kept one
        assert table.classes is not None
        raise DataFileError(
            f"{table.path}: the {len(y_stream)} stream row(s) kept by max_stream={max_stream}"
            f"{'' if shuffle else ' (in file order)'} all hold class "
            f"{_label(table.classes[int(y_stream[0])])}: a classifier cannot learn from them; "
            "raise --max-stream" + ("." if shuffle else " or let the rows be shuffled.")
        )
    spec = _spec(
        "stream",
        table,
        target=target,
        inputs=None if inputs is None else list(inputs),
        drop_row_index=drop_row_index,
        drop_identifiers=drop_identifiers,
        drop_fractional_identifiers=drop_fractional_identifiers,
        test_fraction=test_fraction,
        test_mask=test_mask,
        task=task,
        shuffle=shuffle,
        seed=seed,
        max_stream=max_stream,
        max_test=max_test,
    )
    if task == "classification":
        # which label of the file became class 0 and which 1 (``pred_prob`` is p(class 1)),
        # recorded with the run (config.json) for its reader; rebuilt from the file on resume
        assert table.classes is not None
        spec["classes"] = [_label_value(c) for c in table.classes]
    return StreamProblem(
        name=_stem(table.path),
        X_stream=X_stream,
        y_stream=y_stream,
        X_test=X_test,
        y_test=y_test,
        bounds=_data_bounds(X),
        spec=spec,
        task=task,
    )


def _label_value(value: Any) -> str | float:
    """A class label as the file holds it, as JSON keeps it: text as it is, a number as a
    float."""
    return str(value) if isinstance(value, str) else float(value)


def pool_from_file(
    path: str | os.PathLike,
    target: str | int | None = None,
    inputs: Sequence[str | int] | None = None,
    test_fraction: float | None = None,
    test_mask: str | int | os.PathLike | None = None,
    seed: int = 0,
    pool_size: int | None = None,
    expected_sha256: str | None = None,
    expected_mask_sha256: str | None = None,
    drop_row_index: bool = True,
    drop_identifiers: bool = True,
    drop_fractional_identifiers: bool = False,
) -> PoolProblem:
    r"""A :class:`~bo_online.problems.PoolProblem` from a file: the non-test rows are the pool,
    the test rows the held-out set (arguments as :func:`stream_from_file`; ``pool_size`` keeps a
    seeded random subset of the pool). Active learning regresses on the target: one of two
    distinct values only (0/1 labels) is warned of, as regression treats them as numbers."""
    test_mask = _mask_option(test_mask)
    table, X, y, mask = _split_table(
        path,
        target,
        inputs,
        test_fraction,
        test_mask,
        seed,
        expected_sha256,
        expected_mask_sha256,
        drop_row_index,
        drop_identifiers,
        drop_fractional_identifiers=drop_fractional_identifiers,
    )
    pool = np.flatnonzero(~mask)
    if pool_size is not None:
        if not 1 <= pool_size <= len(pool):
            raise DataFileError(f"pool size must be in 1..{len(pool)}, got {pool_size}.")
        pool = np.sort(np.random.default_rng(seed).permutation(pool)[:pool_size])
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    return PoolProblem(
        name=_stem(table.path),
        X_pool=t(X[pool]),
        y_pool=t(y[pool]),
        X_test=t(X[mask]),
        y_test=t(y[mask]),
        bounds=_data_bounds(X),
        spec=_spec(
            "pool",
            table,
            target=target,
            inputs=None if inputs is None else list(inputs),
            drop_row_index=drop_row_index,
            drop_identifiers=drop_identifiers,
            drop_fractional_identifiers=drop_fractional_identifiers,
            test_fraction=test_fraction,
            test_mask=test_mask,
            seed=seed,
            pool_size=pool_size,
        ),
    )


def _mask_option(test_mask: str | int | os.PathLike | None) -> str | int | None:
    """A test mask given as a :class:`~pathlib.Path` as the path string a file mask is read and
    recorded as (taken for a column name, it was refused as "no column PosixPath(...)")."""
    return os.fspath(test_mask) if isinstance(test_mask, os.PathLike) else test_mask


def _split_table(
    path: str | os.PathLike,
    target: str | int | None,
    inputs: Sequence[str | int] | None,
    test_fraction: float | None,
    test_mask: str | int | None,
    seed: int,
    expected_sha256: str | None,
    expected_mask_sha256: str | None = None,
    drop_row_index: bool = True,
    drop_identifiers: bool = True,
    regression: bool = True,
    classifiable: bool = False,
    task_given: bool = True,
    drop_fractional_identifiers: bool = False,
) -> tuple[Table, np.ndarray, np.ndarray, np.ndarray]:
    r"""The checked table of a user's file, its input columns ``X`` (``n x d``), target ``y``
    (``n``) and test-row mask (``n``, bool), as :func:`stream_from_file` and
    :func:`pool_from_file` read them (a ``regression`` target is checked against what a model
    accepts; class labels are mapped to 0/1 first). ``classifiable``: the caller reads class
    labels too (a stream), so a text target of a regression is told of ``--task
    classification``; a pool's is not (``active`` has no such option). ``task_given``: a
    stream's task was chosen, not defaulted; a regression target of two distinct values only is
    warned of (:func:`_warn_two_valued_target`) unless it was."""
    if test_mask is not None and test_fraction is not None:
        raise DataFileError("give a test fraction or a test mask, not both.")
    table = _checked(path, expected_sha256)
    _check_mask_file(test_mask, expected_mask_sha256)
    mask, m_col = _test_mask(table, test_mask, test_fraction, seed)
    if target is None:  # the last column that is not the mask column
        t_col = len(table.columns) - (2 if m_col == len(table.columns) - 1 else 1)
    else:
        t_col = table._index(target, "the target")
    if regression:  # class labels may be text: checked by _labels
        table.require([t_col], "the target" if classifiable else "a pool's target")
    if t_col == m_col:
        raise DataFileError(
            f"{table.path}: column {table.columns[t_col]!r} cannot be both the target and the "
            "test mask."
        )
    cols = _inputs(
        table,
        inputs,
        {t_col} | ({m_col} if m_col is not None else set()),
        drop_row_index,
        drop_identifiers,
        drop_fractional_identifiers,
    )
    _require_finite_widths(table, cols)
    y = table.data[:, t_col]
    if regression:
        _require_modest_targets(table, t_col)
        if not (classifiable and task_given):
            _warn_two_valued_target(table, t_col, classifiable)
    else:  # named by t_col: the target need not be the last column (a last mask column)
        y = _labels(table, t_col, ~mask)
    return table, table.data[:, cols], y, mask


def _warn_two_valued_target(table: Table, column: int, classifiable: bool) -> None:
    r"""Warn where a regression's target column holds two distinct values only (``0`` / ``1``
    labels, most often): the run regresses on them as numbers. ``classifiable``: a stream,
    whose warning names ``--task classification``; a pool's says that active learning has no
    classification."""
    values = np.unique(table.data[:, column])
    if values.size != 2:
        return
    name, (a, b) = table.columns[column], (_label(v) for v in values)
    if classifiable:
        advice = (
            "if they are class labels, pass --task classification (Python: "
            "task='classification'); --task regression keeps the regression without this "
            "warning."
        )
    else:
        advice = (
            "active learning has no classification, so its RMSE and NLL are those of a "
            f"regression on {a} / {b}; to classify these rows, stream them: bo-online stream "
            "--data FILE --task classification."
        )
    warnings.warn(
        f"{table.path}: target column {name!r} holds two distinct values only ({a} and {b}), "
        f"and regression treats them as numbers; {advice}",
        UserWarning,
        stacklevel=4,  # the caller of stream_from_file / pool_from_file
    )


def _require_finite_widths(table: Table, cols: Sequence[int]) -> None:
    r"""Refuse an input column whose range (max - min) overflows float64: every cell is finite,
    but the scaling to the unit cube divides by that width (it made NaN inputs, reported as
    missing values of no named file or column)."""
    X = table.data[:, list(cols)]
    with np.errstate(over="ignore"):
        widths = X.max(0) - X.min(0)
    for j, width in zip(cols, widths):
        if not np.isfinite(width):
            column = table.data[:, j]
            raise DataFileError(
                f"{table.path}: input column {table.columns[j]!r} spans {column.min():.3g} .. "
                f"{column.max():.3g}, a range that overflows float64 when the inputs are scaled "
                "to the unit cube; rescale the column (e.g. divide it by 1e10)."
            )


def _require_modest_targets(table: Table, column: int) -> None:
    r"""Refuse a target cell of a magnitude no float64 model accepts (:func:`max_abs_output`):
    every cell is finite, but the model refused the value only when its row arrived, mid-run,
    naming neither the file nor the column."""
    y = table.data[:, column]
    limit = max_abs_output(torch.float64)
    too_large = np.flatnonzero(np.abs(y) >= limit)
    if too_large.size:
        row = int(too_large[0])
        raise DataFileError(
            f"{table.path}: {table.where(row)}, column {table.columns[column]!r} (no. "
            f"{column + 1}) is {y[row]:.3g}; a target must stay below {limit:.3g} in magnitude "
            "(beyond it the model's standardisation overflows): rescale the target column "
            "(e.g. divide it by a constant)."
        )


def _stem(path: Path) -> str:
    name = path.name
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _checked(path: str | os.PathLike, expected_sha256: str | None) -> Table:
    path = Path(path).expanduser()
    _require_unchanged(path, expected_sha256, "data file")
    return read_table(path)


def _check_mask_file(test_mask: str | int | None, expected_sha256: str | None) -> None:
    """On resume: refuse a test-mask file that is gone or changed since the run started."""
    if test_mask is not None:
        _require_unchanged(Path(str(test_mask)).expanduser(), expected_sha256, "test-mask file")


def _require_unchanged(path: Path, expected_sha256: str | None, what: str) -> None:
    """Where a hash was recorded (a resume), refuse ``path`` if it is gone or its SHA-256
    differs: the run would go on with other data than it started with."""
    if expected_sha256 is None:
        return
    if not path.is_file():
        option = {"data file": "data", "test-mask file": "test_mask"}.get(what)
        moved = (
            f", or give its new place with `bo-online resume RUN_DIR --{option.replace('_', '-')} "
            f"NEW_PATH` (Python: load_loop(RUN_DIR, {option}=NEW_PATH))"
            if option is not None
            else ""
        )
        raise DataChangedError(
            f"{path}: the run's {what} is gone; put it back to resume the run{moved}."
        )
    actual = file_sha256(path)
    if actual != expected_sha256:
        raise DataChangedError(
            f"{path} has changed since the run started (SHA-256 {actual[:12]}... instead of "
            f"{expected_sha256[:12]}...); restore the original {what} to resume, or start a new "
            "run (--overwrite)."
        )


def problem_from_spec(spec: dict[str, Any]) -> StreamProblem | PoolProblem:
    r"""Rebuild a file problem from its ``spec`` (as stored in a checkpoint), refusing a file
    whose SHA-256 differs from the recorded one."""
    spec = dict(spec)
    spec.pop("name", None)
    kind = spec.pop("kind")
    path, sha = spec.pop("path"), spec.pop("sha256")
    mask_sha = spec.pop("test_mask_sha256", None)
    spec.pop("classes", None)  # what the file's labels were mapped to: read from it again
    build = stream_from_file if kind == "stream" else pool_from_file
    # a run from before a rule kept the columns it leaves out: one without drop_row_index
    # predates both rules
    before_both = "drop_row_index" not in spec
    spec.setdefault("drop_row_index", False)
    spec["drop_identifiers"] = bool(spec.get("drop_identifiers", False)) and not before_both
    # one recorded with drop_identifiers but not this key left out an identifier's name over
    # fractions too
    spec.setdefault("drop_fractional_identifiers", spec["drop_identifiers"])
    return build(path, expected_sha256=sha, expected_mask_sha256=mask_sha, **spec)
