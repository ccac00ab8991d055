"""GPTDataset: fixed-length samples cut from a stream of documents, in a shuffled order.

Three index arrays turn "sample i" into tokens, built once and cached (utils.build_or_load_indices):

* document index  (1-D) the split's documents, repeated for as many epochs as the requested
                  number of samples needs, shuffled: the order of the token stream;
* sample index    (2-D) where each sample starts in that stream: (position in the document
                  index, token offset in that document), see helpers.build_sample_idx;
* shuffle index   (1-D) a permutation of the samples, so consecutive samples of a batch come
                  from different parts of the corpus.

A sample crosses document boundaries freely: documents are glued end to end (separated by the
end-of-document token if preprocessing appended one). The model reads seq_length + 1 tokens and
learns to predict tokens[1:] from tokens[:-1]: labels are the inputs shifted by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minitron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from minitron.core.datasets.helpers import build_sample_idx
from minitron.core.datasets.indexed_dataset import IndexedDataset
from minitron.core.datasets.megatron_dataset import MegatronDataset
from minitron.core.datasets.utils import Split, build_or_load_indices, log_single_rank
from minitron.trace import traced

_PAD_TOKEN_ID = -1  # marks padding inside a sample until it is masked and replaced by 0


@dataclass
class GPTDatasetConfig(BlendedMegatronDatasetConfig):
    reset_position_ids: bool = False
    """Restart position ids after every end-of-document token."""
    reset_attention_mask: bool = False
    """Stop attention across end-of-document tokens (a block-diagonal causal mask)."""
    eod_mask_loss: bool = False
    """Do not train on predicting the end-of-document token."""
    create_attention_mask: bool = True
    """Build the [1, s, s] causal mask here; off when the attention kernel makes its own."""
    drop_last_partial_validation_sequence: bool = True
    add_extra_token_to_sequence: bool = True
    """Read seq_length + 1 tokens, so inputs and labels are both seq_length long."""


class GPTDataset(MegatronDataset):
    def __init__(self, indexed_dataset, dataset_path, indexed_indices, num_samples, index_split,
                 config: GPTDatasetConfig):
        super().__init__(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config)
        self._pad_token_id = getattr(config.tokenizer, "pad", None)
        if self._pad_token_id is None:
            self._pad_token_id = _PAD_TOKEN_ID
        self.built_anew_on_cache_miss = False
        self._cached_masks = None
        self.document_index, self.sample_index, self.shuffle_index = self._build_document_sample_shuffle_indices()

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config) -> IndexedDataset:
        return IndexedDataset(dataset_path)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset) -> int:
        # GPT splits by sequence (= document when sentences are not split).
        return low_level_dataset.sequence_lengths.shape[0]

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1

    # --8<-- [start:getitem]
    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        # idx None: a padding sample for an incomplete last batch; it must not count in the loss.
        text, _ = self._query_document_sample_shuffle_indices(0 if idx is None else idx)
        text = torch.from_numpy(text).long()
        if self.config.add_extra_token_to_sequence:
            tokens, labels = text[:-1].contiguous(), text[1:].contiguous()
        else:
            tokens = text
            labels = torch.roll(text, shifts=-1, dims=0)
            labels[-1] = self._pad_token_id
        attention_mask, loss_mask, position_ids = self._masks_and_position_ids(tokens)
        loss_mask[labels == self._pad_token_id] = 0.0  # nothing to learn from padding
        tokens[tokens == self._pad_token_id] = 0       # and the embedding needs a valid id
        labels[labels == self._pad_token_id] = 0
        if idx is None:
            loss_mask = torch.zeros_like(loss_mask)
        sample = {"tokens": tokens, "labels": labels}
        if attention_mask is not None:
            sample["attention_mask"] = attention_mask
        sample["loss_mask"] = loss_mask
        sample["position_ids"] = position_ids
        return sample
    # --8<-- [end:getitem]

    def _masks_and_position_ids(self, tokens):
        """Without the reset/eod options the masks are the same for every sample: build once."""
        cfg = self.config
        cacheable = not (cfg.reset_position_ids or cfg.reset_attention_mask or cfg.eod_mask_loss)
        if not cacheable or self._cached_masks is None:
            masks = _get_ltor_masks_and_position_ids(
                tokens, cfg.tokenizer.eod, cfg.reset_position_ids, cfg.reset_attention_mask,
                cfg.eod_mask_loss, cfg.create_attention_mask)
            if not cacheable:
                return masks
            self._cached_masks = masks
        attention_mask, loss_mask, position_ids = self._cached_masks
        # Copies of the mutable ones: the caller zeroes padding in loss_mask.
        return attention_mask, loss_mask.clone(), position_ids.clone()

    def _query_document_sample_shuffle_indices(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of sample ``idx`` (seq_length + extra of them) and the documents they came from."""
        idx = self.shuffle_index[idx]
        doc_beg, offset_beg = self.sample_index[idx]
        doc_end, offset_end = self.sample_index[idx + 1]
        extra = int(self.config.add_extra_token_to_sequence)
        document_ids, parts = [], []
        for i in range(doc_beg, doc_end + 1):
            document_ids.append(self.document_index[i])
            offset = offset_beg if i == doc_beg else 0
            # The last document is read up to the next sample's start, plus the shared token.
            length = offset_end + extra - offset if i == doc_end else None
            parts.append(self.dataset.get(self.document_index[i], offset=int(offset),
                                          length=None if length is None else int(length)))
        need = self.config.sequence_length + extra
        have = sum(len(p) for p in parts)
        if have < need:  # only a partial last validation sample can be short
            parts.append(np.full(need - have, self._pad_token_id, dtype=np.int64))
        return np.concatenate(parts).astype(np.int64), np.array(document_ids, dtype=np.int64)

    @traced(args=lambda self: {"split": self.index_split.name, "num_samples": self.num_samples})
    def _build_document_sample_shuffle_indices(self):
        path_to_cache = self.config.path_to_cache
        if path_to_cache is None and not self.config.mock:
            # Megatron's default: a folder named after the prefix, beside the .bin/.idx.
            path_to_cache = f"{self.dataset.path_prefix}/cache/{type(self).__name__}_indices"
        base = f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}"
        arrays, self.built_anew_on_cache_miss = build_or_load_indices(
            None if self.config.mock else path_to_cache, base, self.unique_description,
            ("document_index", "sample_index", "shuffle_index"), self._build_indices)
        log_single_rank(f"> {type(self).__name__} {self.index_split.name}: "
                        f"{arrays['sample_index'].shape[0] - 1} samples "
                        f"({'built' if self.built_anew_on_cache_miss else 'loaded from cache'})")
        return arrays["document_index"], arrays["sample_index"], arrays["shuffle_index"]

    @traced(args=lambda self: {"split": self.index_split.name})
    def _build_indices(self) -> dict[str, np.ndarray]:
        seq_length = self.config.sequence_length
        extra = int(self.config.add_extra_token_to_sequence)
        tokens_per_epoch = int(np.sum(self.dataset.sequence_lengths[self.indices]))
        if tokens_per_epoch <= seq_length:
            raise ValueError(f"the {self.index_split.name} split of {self.dataset_path} has "
                             f"{tokens_per_epoch} tokens, not enough for one sample of "
                             f"{seq_length}; use a larger corpus or change --split")
        num_epochs = _get_num_epochs(tokens_per_epoch, self.num_samples, seq_length, extra)

        # The last epoch is only partly used. If it is used for less than 80% of an epoch,
        # shuffle it separately: otherwise a global shuffle would let the few samples taken
        # from it favour some documents over others.
        separate_final_epoch = False
        if num_epochs > 1:
            samples_before_final = ((num_epochs - 1) * tokens_per_epoch - extra) // seq_length
            samples_from_final = self.num_samples - samples_before_final
            samples_per_epoch = (tokens_per_epoch - extra) // seq_length
            separate_final_epoch = samples_from_final < int(0.80 * samples_per_epoch)

        rng = np.random.RandomState(self.config.random_seed)
        document_index = _build_document_index(self.indices, num_epochs, rng, separate_final_epoch)
        drop_last = self.index_split != Split.valid or self.config.drop_last_partial_validation_sequence
        sample_index = build_sample_idx(self.dataset.sequence_lengths, document_index, seq_length,
                                        num_epochs, tokens_per_epoch, drop_last, extra)
        num_samples = sample_index.shape[0] - 1
        first = samples_before_final if separate_final_epoch else num_samples
        shuffle_index = _build_shuffle_index(first, num_samples, rng)
        return {"document_index": document_index, "sample_index": sample_index,
                "shuffle_index": shuffle_index}


def _get_num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int, extra: int) -> int:
    """The fewest passes over the split that yield num_samples samples (1 when None)."""
    if num_samples is None:
        return 1
    needed = num_samples * seq_length + extra
    return max(1, -(-needed // tokens_per_epoch)) if tokens_per_epoch > 0 else 1


def _build_document_index(documents, num_epochs, rng, separate_final_epoch) -> np.ndarray:
    """The documents once per epoch, shuffled (the final epoch on its own if asked)."""
    if not separate_final_epoch or num_epochs == 1:
        document_index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        rng.shuffle(document_index)
        return document_index
    first = _build_document_index(documents, num_epochs - 1, rng, False)
    last = _build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def _build_shuffle_index(num_samples: int, total_size: int, rng) -> np.ndarray:
    """A permutation of [0, num_samples), then one of [num_samples, total_size)."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def _get_ltor_masks_and_position_ids(data, eod_token, reset_position_ids, reset_attention_mask,
                                     eod_mask_loss, create_attention_mask=True):
    """Left-to-right masks for one sample of s tokens.

    attention_mask: [1, s, s] bool, True where attention is *forbidden* (the future; with
    reset_attention_mask also earlier documents). loss_mask: [s] float, 0 where no loss is taken.
    position_ids: [s], restarted after each eod when reset_position_ids.
    """
    seq_length = data.numel()
    loss_mask = torch.ones(seq_length, dtype=torch.float, device=data.device)   # a sample: host memory
    if eod_mask_loss:
        loss_mask[data == eod_token] = 0.0
    position_ids = torch.arange(seq_length, dtype=torch.long, device=data.device)
    allowed = torch.tril(torch.ones(seq_length, seq_length, device=data.device)) if create_attention_mask else None
    if reset_position_ids or reset_attention_mask:
        prev = 0
        for i in (data == eod_token).nonzero().view(-1).tolist():
            if reset_attention_mask and allowed is not None:
                allowed[i + 1:, :i + 1] = 0  # later tokens may not look back past this eod
            if reset_position_ids:
                position_ids[i + 1:] -= i + 1 - prev
                prev = i + 1
    attention_mask = None if allowed is None else (allowed < 0.5).unsqueeze(0)
    return attention_mask, loss_mask, position_ids


class MockGPTLowLevelDataset:
    """Synthetic documents, the same on every rank and every run: tests need no corpus.

    Document i has a length drawn once from a seeded generator and holds 1, 2, 3, ... (wrapping
    below the eod id, so every id fits the vocabulary), then the eod token. Megatron draws
    100,000 documents of up to 4,095 tokens; we draw 10,000 of up to 1,023, because every rank
    that needs mock data builds its indices itself, and on CPU ranks that build should be quick.
    """

    seed, size, max_sequence_length = 0, 10000, 1024

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        rng = np.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(1, self.max_sequence_length, size=self.size, dtype=np.int32)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> np.ndarray:
        length = int(self.sequence_lengths[idx])
        eod = int(self.tokenizer.eod)
        body = np.arange(length - 1, dtype=np.int64) % max(eod - 1, 1) + 1
        return np.concatenate([body, [eod]]).astype(np.int64)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        if length is None:
            length = int(self.sequence_lengths[idx]) - offset
        return self[idx][offset:offset + length]


class MockGPTDataset(GPTDataset):
    """GPTDataset over MockGPTLowLevelDataset; built wherever it is asked for, never cached."""

    def __init__(self, dataset, dataset_path, indices, num_samples, index_split, config):
        assert config.mock, "MockGPTDataset needs a config without a blend (mock data)"
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)

    @staticmethod
    def build_low_level_dataset(dataset_path, config) -> MockGPTLowLevelDataset:
        return MockGPTLowLevelDataset(config.tokenizer)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset) -> int:
        return len(low_level_dataset)
