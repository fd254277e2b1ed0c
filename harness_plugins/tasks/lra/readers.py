"""Readers of the Long Range Arena's real-data tasks: the researcher's own copy of each
dataset, in the layout its release has (nothing is downloaded; nothing is unpickled).

* Text (``lra_text``): the IMDb reviews of Maas et al. (2011) as Stanford releases them,
  ``aclImdb/{train,test}/{pos,neg}/*.txt`` (LRA loads the same reviews through
  ``tfds.load("imdb_reviews")``).
* Retrieval (``lra_retrieval``): LRA's ACL Anthology Network pairs, ``new_aan_pairs.{train,
  eval,test}.tsv`` in ``lra_release/tsv_data/`` of LRA's release: one pair a line, five
  tab-separated fields ``label id1 id2 text1 text2``, no header, no quoting.
* Image (``lra_image``): CIFAR-10's *binary* release (``cifar-10-batches-bin``:
  ``data_batch_1.bin`` .. ``data_batch_5.bin``, ``test_batch.bin``), records of 1 label byte
  and 3,072 pixel bytes (1,024 red, 1,024 green, 1,024 blue, row-major).

Where a file is missing, :func:`missing` raises a :class:`MissingDataError` naming what to
download and where to put it. Each reader reads bytes: the tasks are byte- or pixel-level.
"""

from __future__ import annotations

from pathlib import Path

from harness.plugin import ConfigError, MissingDataError, read_user_file

#: Where each dataset is looked for when the task's ``data_dir`` is empty: under the
#: project's folder (``$HARNESS_HOME`` or the nearest ``.harness``), in ``data/lra/``.
DEFAULT_FOLDERS = {"text": "aclImdb", "retrieval": "lra_release/tsv_data", "image": "cifar-10-batches-bin"}
DOWNLOADS = {
    "text": "the IMDb reviews, https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz "
            "(unpack it: the folder is aclImdb)",
    "retrieval": "LRA's release, https://storage.googleapis.com/long-range-arena/lra_release.gz "
                 "(unpack it: the folder is lra_release/tsv_data)",
    "image": "CIFAR-10's binary version, https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz "
             "(unpack it: the folder is cifar-10-batches-bin; not the python version, which is pickled)",
}
CIFAR_RECORD = 1 + 3 * 1024
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
             "test": "new_aan_pairs.test.tsv"}
#: why the seed does not change a real-data task's examples (an exemption from that check)
SAME_DATA = ("the examples are the researcher's copy of a released dataset, the same for every "
             "seed: the seed changes the model's initialisation and the batch order")
#: ITU-R BT.601 luma, the weights of ``tf.image.rgb_to_grayscale`` that LRA applies
LUMA = (0.2989, 0.5870, 0.1140)


def folder(data_dir: str, dataset: str) -> Path:
    """The configured folder, or the default one under the project's folder."""
    if data_dir:
        return Path(data_dir).expanduser()
    from harness.store.tracking import home

    return home() / "data" / "lra" / DEFAULT_FOLDERS[dataset]


def missing(task: str, dataset: str, where: Path, what: str) -> MissingDataError:
    return MissingDataError(
        f"task '{task}' reads {what} from {where}, and it is not there. Download "
        f"{DOWNLOADS[dataset]} and set task.params.data_dir to that folder (or put it at "
        f"{folder('', dataset)}). Nothing is downloaded for you: the data is your own copy."
    )


def require_file(task: str, dataset: str, path: Path, what: str, record: int | None = None) -> None:
    """``path`` is there and could hold data, checked when the task is built: a missing file is
    :func:`missing`; an empty one (or, with ``record``, one that is not whole records of that
    size) a ConfigError, before anything trains, whichever split it holds (a run reads only
    train and val: a damaged test file would otherwise go unnoticed until someone scores it)."""
    if not path.is_file():
        raise missing(task, dataset, path, what)
    size = path.stat().st_size
    if not size:
        raise ConfigError(f"task '{task}' reads {what} from {path}, which is empty (0 bytes). Replace "
                          f"it with the file from the release ({DEFAULT_FOLDERS[dataset]}).")
    if record is not None and size % record:
        raise ConfigError(
            f"task '{task}' reads {what} from {path}, which has {size:,} bytes, not a multiple of "
            f"{record:,} (one record): it is truncated or not a file of the release. Replace it with "
            f"the file from the release ({DEFAULT_FOLDERS[dataset]}).")


def byte_symbols() -> tuple[str, ...]:
    """Names of the 256 byte values (printable ASCII as itself)."""
    return tuple(chr(b) if 32 < b < 127 else f"<{b:02x}>" for b in range(256))


def read_imdb(root: Path, split: str) -> list[tuple[bytes, int]]:
    """(review bytes, label) of one split (``train`` or ``test``): negatives 0, positives 1,
    in file-name order (negatives first)."""
    out = []
    for label, name in ((0, "neg"), (1, "pos")):
        files = sorted((root / split / name).glob("*.txt"))
        if not files:
            raise ConfigError(f"the folder {root / split / name} holds no review (*.txt files); "
                              f"task.params.data_dir must be the unpacked aclImdb folder, whole.")
        out += [(read_user_file(path, "the review"), label) for path in files]
    return out


def read_aan(path: Path) -> list[tuple[int, bytes, bytes]]:
    """(label, text1, text2) of each line of an AAN pairs TSV."""
    out = []
    for number, line in enumerate(read_user_file(path, "the retrieval file").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(b"\t")
        try:
            if len(fields) != 5:
                raise ValueError(f"{len(fields)} tab-separated fields, not 5")
            label = float(fields[0])
            if label not in (0.0, 1.0):
                raise ValueError(f"label {fields[0]!r} is not 0 or 1")
        except ValueError as exc:
            raise ConfigError(
                f"{path} line {number}: {exc}. LRA's retrieval files have one pair a line: "
                f"label, id1, id2, text1, text2, separated by tabs (no header)."
            ) from None
        out.append((int(label), fields[3], fields[4]))
    if not out:
        raise ConfigError(f"{path} holds no pair (it is empty); LRA's retrieval files have one pair "
                          f"a line. Replace it with the file from LRA's release.")
    return out


def read_cifar(path: Path) -> list[tuple[int, bytes]]:
    """(label, 1,024 grey pixels) of each record of a CIFAR-10 binary batch file."""
    data = read_user_file(path, "the CIFAR-10 batch file")
    if not data:
        raise ConfigError(f"{path} is empty (0 bytes); a CIFAR-10 batch file holds 10,000 records of "
                          f"{CIFAR_RECORD:,} bytes. Replace it with the file from CIFAR-10's binary release.")
    if len(data) % CIFAR_RECORD:
        raise ConfigError(
            f"{path} has {len(data)} bytes, not a multiple of {CIFAR_RECORD} (1 label byte and "
            f"3,072 pixel bytes a record): it is not a file of CIFAR-10's binary release."
        )
    out = []
    for at in range(0, len(data), CIFAR_RECORD):
        label = data[at]
        if label > 9:
            raise ConfigError(f"{path}: record {at // CIFAR_RECORD} has label {label}; CIFAR-10's are 0-9.")
        r, g, b = (data[at + 1 + c * 1024: at + 1 + (c + 1) * 1024] for c in range(3))
        out.append((label, grey(r, g, b)))
    return out


def grey(r: bytes, g: bytes, b: bytes) -> bytes:
    """Luma of each pixel, rounded to a byte."""
    wr, wg, wb = LUMA
    return bytes(min(255, round(wr * x + wg * y + wb * z)) for x, y, z in zip(r, g, b, strict=True))
