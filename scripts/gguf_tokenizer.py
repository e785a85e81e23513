"""Writes the tokenizer of a GGUF model (a byte-level BPE one: tokenizer.ggml.model 'gpt2') as a
Hugging Face tokenizer.json, for batchinfer's tests: the 'tokenizer' of an endpoint model whose
server runs that GGUF file (llama.cpp's, SmolLM2's).

  python gguf_tokenizer.py MODEL.gguf tokenizer.json
"""

import json
import struct
import sys

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}


def read_gguf_metadata(path):
    with open(path, "rb") as f:
        def take(fmt):
            size = struct.calcsize(fmt)
            return struct.unpack(fmt, f.read(size))[0]

        def string():
            return f.read(take("<Q")).decode("utf-8", errors="surrogateescape")

        def value(kind):
            if kind == 8:
                return string()
            if kind == 9:
                inner, n = take("<I"), take("<Q")
                return [value(inner) for _ in range(n)]
            return take(SCALARS[kind])

        assert f.read(4) == b"GGUF", "not a GGUF file"
        version = take("<I")
        assert version >= 2, version
        take("<Q")  # tensors
        kvs = take("<Q")
        meta = {}
        for _ in range(kvs):
            key = string()
            meta[key] = value(take("<I"))
        return meta


def main():
    source, target = sys.argv[1], sys.argv[2]
    meta = read_gguf_metadata(source)
    assert meta["tokenizer.ggml.model"] == "gpt2", meta["tokenizer.ggml.model"]
    tokens = meta["tokenizer.ggml.tokens"]
    kinds = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = meta["tokenizer.ggml.merges"]
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    # llama.cpp's 'smollm' pre-tokenizer: each digit alone, then GPT-2's.
    pre_tokenizer = (
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                               byte_level]}
        if pre == "smollm" else byte_level
    )
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, k) in enumerate(zip(tokens, kinds)) if k == 3]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": merges},
    }
    with open(target, "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    print(f"{len(tokens)} tokens, {len(merges)} merges, pre-tokenizer {pre}, "
          f"{len(added)} special")


if __name__ == "__main__":
    main()
