"""The data and tokenizer checks that can run before launch (the flags are in argument_groups).

validate_args calls ``validate_data_args(args)`` last. Everything checked here is checked on
the command line's machine, before a single rank starts: a missing .idx is one line, not 16
tracebacks from 16 ranks.
"""

from __future__ import annotations

import os

from minitron.training.argument_groups import ArgumentError


def validate_data_args(args) -> None:
    """Fill the defaults that depend on other flags; reject what cannot work (ArgumentError)."""
    if args.dataloader_type is None:
        args.dataloader_type = "single"
    if args.num_workers < 0:
        raise ArgumentError(f"--num-workers must be 0 or more, got {args.num_workers}")
    if args.data_path is not None and len(args.data_path) == 0:
        raise ArgumentError("--data-path needs at least one PREFIX")
    if args.data_path and args.mock_data:
        raise ArgumentError("--data-path and --mock-data exclude each other: choose one")
    # Megatron takes "no blend" to mean mock data and then fails in every rank when the
    # dataset class (GPTDataset) cannot play mock; we say so once, here.
    if (args.train_iters or args.train_samples) and not args.data_path and not args.mock_data:
        raise ArgumentError("training needs data: give --data-path PREFIX (made by `minitron preprocess`) "
                            "or --mock-data")
    if args.data_path:
        if args.split is None:
            args.split = "969, 30, 1"  # Megatron's default
        _check_data_path(args.data_path, args.split)
    elif args.split is not None:
        _check_split(args.split)
    if args.data_cache_path is not None and os.path.exists(args.data_cache_path) \
            and not os.path.isdir(args.data_cache_path):
        raise ArgumentError(f"--data-cache-path {args.data_cache_path} is a file, not a directory")
    _validate_tokenizer(args)


def _check_split(split: str) -> None:
    # The dataset modules import numpy and torch; only a --split or --data-path needs them,
    # so a refused layout never pays for them.
    from minitron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    try:
        parse_and_normalize_split(split)
    except ValueError as err:
        raise ArgumentError(str(err)) from None


def _check_data_path(data_path: list[str], split: str) -> None:
    # As in _check_split: numpy only when there is a blend to read (the blend parser is torch-free).
    from minitron.core.datasets.utils import get_blend_from_list

    try:
        prefixes, _ = get_blend_from_list(data_path)
    except ValueError as err:
        raise ArgumentError(str(err)) from None
    _check_split(split)
    for prefix in prefixes:
        if prefix.endswith((".bin", ".idx")):
            raise ArgumentError(f"--data-path {prefix}: give the prefix, without .bin/.idx")
        missing = [f"{prefix}{ext}" for ext in (".idx", ".bin") if not os.path.isfile(prefix + ext)]
        if missing:  # said before torch loads (IndexedDataset's module imports it): seconds saved
            raise ArgumentError(f"{' and '.join(missing)} not found: --data-path takes the prefix of a .bin/.idx "
                                "pair written by `minitron preprocess` (e.g. data/corpus_text_document)")
    # torch, with the module that reads the files: only once they are there to be read
    from minitron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetError

    for prefix in prefixes:
        try:
            IndexedDataset(prefix)  # opens and checks both files; maps, reads nothing
        except IndexedDatasetError as err:
            raise ArgumentError(str(err)) from None


def _validate_tokenizer(args) -> None:
    kind = args.tokenizer_type
    from minitron.training.tokenizer.tokenizer import check_tokenizer_model   # SentencePiece, tiktoken
    problem = check_tokenizer_model(kind, args.tokenizer_model)
    if problem:
        raise ArgumentError(problem)
    if kind == "NullTokenizer" and (args.vocab_size is None or args.vocab_size < 1):
        raise ArgumentError("--tokenizer-type NullTokenizer needs --vocab-size N (N >= 1)")
    if kind == "GPT2BPETokenizer":
        for flag, path in (("--vocab-file", args.vocab_file), ("--merge-file", args.merge_file)):
            if not path:
                raise ArgumentError(f"--tokenizer-type GPT2BPETokenizer needs {flag}")
            if not os.path.isfile(path):
                raise ArgumentError(f"{flag} {path}: no such file")
    if kind == "HuggingFaceTokenizer":
        if not args.tokenizer_model:
            raise ArgumentError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model PATH")
        if not os.path.exists(args.tokenizer_model):
            raise ArgumentError(f"--tokenizer-model {args.tokenizer_model}: no such file or directory")
