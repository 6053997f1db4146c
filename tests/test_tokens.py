"""rlx.tokens: bulk encoding and decoding through the Rust backend give transformers' own ids and text,
and transformers' call runs wherever the backend alone would not."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from rlx.tokens import decode, decode_many, encode_many, plain_decoder, plain_encoder

TEXTS = ["5", "", " two\nlines ", "<|im_start|>user\nhi<|im_end|>", "émoji 🧮", "12 + 35 = 47", "<tool_call>\n{}"]


@pytest.fixture(scope="module")
def tokenizer(untrained_model):
    return AutoTokenizer.from_pretrained(untrained_model[0].tiny_model.output_dir)


def test_the_backend_gives_the_wrapper_s_ids_and_text(tokenizer):
    assert plain_encoder(tokenizer) is not None and plain_decoder(tokenizer) is not None
    expected = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    assert encode_many(tokenizer, TEXTS) == expected
    assert encode_many(tokenizer, []) == []
    for skip in (False, True):
        texts = [tokenizer.decode(ids, skip_special_tokens=skip) for ids in expected]
        assert decode_many(tokenizer, expected, skip) == texts
        assert [decode(tokenizer, ids, skip) for ids in expected] == texts
    assert decode_many(tokenizer, expected, False) != decode_many(tokenizer, expected, True)  # (a special token)


def test_the_wrapper_runs_where_the_backend_alone_would_differ(tokenizer):
    """A backend left padding or truncating, special tokens split, or text cleaned up after decoding."""
    padded = copy.deepcopy(tokenizer)
    padded.backend_tokenizer.enable_padding(length=16, pad_id=0)
    truncated = copy.deepcopy(tokenizer)
    truncated.backend_tokenizer.enable_truncation(max_length=2)
    split = copy.deepcopy(tokenizer)
    split.split_special_tokens = True
    for other in (padded, truncated, split):
        assert plain_encoder(other) is None
        assert encode_many(other, TEXTS) == other(TEXTS, add_special_tokens=False)["input_ids"]
    assert encode_many(split, TEXTS) != encode_many(tokenizer, TEXTS)  # (so the case is a real one)
    cleaned = copy.deepcopy(tokenizer)
    cleaned.clean_up_tokenization_spaces = True
    assert plain_decoder(cleaned) is None
    ids = encode_many(tokenizer, ["a , b ."])
    assert decode_many(cleaned, ids, False) == [cleaned.decode(ids[0])]
