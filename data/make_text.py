#!/usr/bin/env python3
"""Makes the text fixtures for `embed`: real English sentences and reference embeddings.

Sentences come from the docstrings and comments of Python's standard library (its public API,
then every docstring and comment block in its sources), the Python Language Reference that ships
with it (`pydoc_data.topics`), and the sources of numpy, scipy and scikit-learn: real prose written by people, not generated
word salad. They are split into sentences, filtered to plain prose and de-duplicated, in a fixed
order. The reference embeddings are those of the Python stack a user would write: the
`tokenizers` package + onnxruntime on the same all-MiniLM-L6-v2 files batchinfer uses, mean
pooling over the attention mask and L2 normalization, truncation at 256 tokens.

    pip install onnxruntime==1.31.1 tokenizers pyarrow numpy
    python3 data/make_text.py       # writes data/sample/sentences.parquet, data/reference/minilm.parquet
"""
import importlib
import inspect
import pathlib
import pkgutil
import re
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

HERE = pathlib.Path(__file__).resolve().parent
TARGET = 24_000
REFERENCE_ROWS = 300
MAX_TOKENS = 256

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
PROSE = re.compile(r"^[A-Z][A-Za-z0-9 ,;:'\"\-()/_]*[a-z0-9)][.!?]$")


def docstrings():
    warnings.simplefilter("ignore")
    names = sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_"))
    stdlib = set(sys.stdlib_module_names)
    for name in names:
        if name not in stdlib or name in {"antigravity", "this", "idlelib", "turtledemo", "tkinter"}:
            continue
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        yield inspect.getdoc(module) or ""
        for _, member in sorted(vars(module).items(), key=lambda kv: kv[0]):
            if inspect.isclass(member) or inspect.isfunction(member) or inspect.isbuiltin(member):
                yield inspect.getdoc(member) or ""
                if inspect.isclass(member):
                    for _, method in sorted(vars(member).items(), key=lambda kv: kv[0]):
                        if inspect.isfunction(method):
                            yield inspect.getdoc(method) or ""


def source_roots():
    """The standard library's sources, then those of numpy, scipy and scikit-learn (installed
    for make_data.py), whose docstrings are long-form prose too."""
    import sysconfig

    yield pathlib.Path(sysconfig.get_paths()["stdlib"])
    for name in ("numpy", "scipy", "sklearn"):
        yield pathlib.Path(importlib.import_module(name).__file__).parent


def source_docstrings():
    """Every docstring and comment block in the sources (private and nested ones too)."""
    import ast

    for root in source_roots():
        yield from file_docstrings(root)


def file_docstrings(root: pathlib.Path):
    import ast

    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & {"test", "tests", "idlelib", "site-packages", "turtledemo", "lib2to3"}:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield doc
        # Comment blocks: consecutive '#' lines are one paragraph of prose.
        block = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines() + [""]:
            stripped = line.strip()
            if stripped.startswith("# "):
                block.append(stripped[2:])
            elif block:
                yield " ".join(block)
                block = []


def reference_manual():
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield topics[name]


def sentences():
    seen = set()
    for doc in list(docstrings()) + list(reference_manual()) + list(source_docstrings()):
        for paragraph in doc.split("\n\n"):
            text = " ".join(paragraph.split())
            for sentence in SENTENCE.split(text):
                words = sentence.split()
                if not 6 <= len(words) <= 60 or not PROSE.match(sentence) or sentence in seen:
                    continue
                seen.add(sentence)
                yield sentence


def embed(model_dir: pathlib.Path, texts: list) -> np.ndarray:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding()
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for start in range(0, len(texts), 32):
        encodings = tokenizer.encode_batch(texts[start:start + 32])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        out.append(pooled / norms)
    return np.concatenate(out).astype(np.float32)


def main() -> None:
    texts = []
    for sentence in sentences():
        texts.append(sentence)
        if len(texts) == TARGET:
            break
    print(f"{len(texts)} sentences")
    ids = np.arange(len(texts), dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "body": texts}), HERE / "sample" / "sentences.parquet",
                   compression="zstd")

    model_dir = pathlib.Path(subprocess.check_output(["bash", str(HERE.parent / "scripts" / "fetch_minilm.sh")],
                                                     text=True).strip())
    vectors = embed(model_dir, texts[:REFERENCE_ROWS])
    dim = vectors.shape[1]
    pq.write_table(pa.table({
        "id": ids[:REFERENCE_ROWS],
        "v": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
    }), HERE / "reference" / "minilm.parquet", compression="zstd")


if __name__ == "__main__":
    main()
