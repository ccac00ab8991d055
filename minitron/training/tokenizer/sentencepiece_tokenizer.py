"""--tokenizer-type GPTSentencePieceTokenizer and Llama2Tokenizer: a SentencePiece model file
(--tokenizer-model, e.g. Llama 2's tokenizer.model), read by the `sentencepiece` package.

As Megatron 0.19.2 builds both names (its SentencePiece library tokenizer, not the legacy
wrappers): the vocabulary is the model's pieces, text becomes the model's ids with no BOS or EOS
added, ids become text through the model, and end-of-document is the model's EOS id (``</s>``
for Llama 2). The package is imported only when one of these types is chosen.
"""

from __future__ import annotations

import os


def _load_sentencepiece(tokenizer_type: str, tokenizer_model: str | None):
    if not tokenizer_model:
        raise ValueError(f"--tokenizer-type {tokenizer_type} needs --tokenizer-model PATH (a SentencePiece .model file)")
    try:
        import sentencepiece   # optional: only these tokenizers need it
    except ImportError:
        raise ValueError(f"--tokenizer-type {tokenizer_type} needs the optional `sentencepiece` package: "
                         "pip install sentencepiece") from None
    if not os.path.isfile(tokenizer_model):
        raise ValueError(f"--tokenizer-model {tokenizer_model}: no such SentencePiece model file")
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(tokenizer_model)
    except (OSError, RuntimeError) as err:
        raise ValueError(f"--tokenizer-model {tokenizer_model}: not a SentencePiece model ({err})") from None
    return processor


class SentencePieceTokenizer:
    """GPTSentencePieceTokenizer and Llama2Tokenizer (the two names build the same wrapper)."""

    def __init__(self, tokenizer_model: str | None, tokenizer_type: str = "GPTSentencePieceTokenizer"):
        self.tokenizer = _load_sentencepiece(tokenizer_type, tokenizer_model)
        self.eod = self.tokenizer.eos_id()
        if self.eod < 0:   # a model trained with eos_id=-1 has no end-of-sentence piece
            raise ValueError(f"--tokenizer-model {tokenizer_model}: the model has no EOS piece for end-of-document")
        self.bos = self.tokenizer.bos_id()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_piece_size()

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode_as_ids(text)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode_ids([int(i) for i in ids])
