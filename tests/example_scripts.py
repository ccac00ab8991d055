"""Megatron-LM's example launch scripts (tag core_r0.19.0), as data: what each one hands
pretrain_gpt.py, and the world a real job runs it on.

Each flag list is the script's own, in its order, with its bash variables at their defaults and
its arrays word-split as bash splits them (so a quote inside an array element stays in the
value: the llama3 and gpt-oss scripts pass --split as the five characters '99,1,0' in quotes).
What we had to change is said in ``replaced``: paths to data, tokenizers, checkpoints and logs
become --mock-data or placeholders under ``{tmp}`` (a test's temporary directory), because this
machine holds no corpus, no downloaded tokenizer and never touches the network.

Three of the sources are model configurations only (DeepSeek-V2-Lite for ModelOpt, and two
configs of the RL examples): ``paired`` names the training and parallel flags we chose to run
them with, and ``dropped`` the flags that drive another program than pretrain_gpt.py.

A ``variant`` is the same script with a few flags taken out, each for a reason a reader can
check, to see how far the rest gets (tests/test_example_scripts.py holds what each row does).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace

MOCK_TOKENIZER = "minitron reads no tokenizer from the hub: NullTokenizer with the real vocabulary's size"


@dataclass(frozen=True)
class Script:
    name: str
    source: str                  # path in NVIDIA/Megatron-LM at core_r0.19.0
    world: int                   # the ranks a real job would use
    layout: str                  # how that world splits, and where the number comes from
    flags: str                   # shell words: shlex.split gives the argv
    replaced: dict = field(default_factory=dict)   # what the script says -> what we pass, and why
    paired: str = ""             # model configs: the training/parallel flags we chose
    dropped: dict = field(default_factory=dict)    # model configs: flags for another program
    variant: str = ""            # "" for the script as it is; else what was taken out and why

    def argv(self, tmp) -> list[str]:
        return [w.replace("{tmp}", str(tmp)) for w in shlex.split(self.flags + " " + self.paired)]


def without(script: Script, name: str, why: str, *spans: str) -> Script:
    """The script with each of ``spans`` (a flag and its value, as written) taken out."""
    words = shlex.split(script.flags)
    for span in spans:
        cut = shlex.split(span)
        at = next((i for i in range(len(words)) if words[i:i + len(cut)] == cut), None)
        assert at is not None, f"{span!r} is not in {script.name}"
        del words[at:at + len(cut)]
    return replace(script, name=name, flags=shlex.join(words), variant=why)


GPT3_175B = Script(
    "gpt3_175b", "examples/gpt3/train_gpt3_175b_distributed.sh", 1024,
    "tp 8 × pp 16 × dp 8: the model-parallel sizes are the script's, dp 8 gives the 128 nodes of 8 GPUs "
    "such a run took",
    """--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048
    --max-position-embeddings 2048 --attention-backend auto
    --micro-batch-size 1 --global-batch-size 1536
    --step-batch-size-schedule "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"
    --train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006
    --clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001
    --lr-decay-iters 430000
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
    --mock-data --vocab-file {tmp}/gpt2-vocab.json --merge-file {tmp}/gpt2-merges.txt --split 949,50,1
    --log-interval 100 --save-interval 10000 --eval-interval 1000 --save {tmp}/checkpoints
    --load {tmp}/checkpoints --eval-iters 10 --tensorboard-dir {tmp}/tensorboard""",
    replaced={"--data-path $5": "--mock-data",
              "$1 $2 $3 $4 (checkpoint, logs, GPT-2 vocab and merges)": "paths under {tmp}"})

LLAMA3_8B = Script(
    "llama3_8b", "examples/llama/train_llama3_8b_h100_fp8.sh", 8,
    "dp 8: the script's one node of 8 H100s, tp 1, cp 1, pp 1",
    """--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192
    --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0
    --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --normalization RMSNorm --init-method-std 0.0134
    --attention-backend fused --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear
    --micro-batch-size 1 --global-batch-size 128 --train-samples 1953125000 --lr-decay-samples 1949218748
    --lr-warmup-samples 3906252 --lr 0.00015 --min-lr 0.00001 --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5
    --lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16
    --grad-reduce-in-bf16 --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc
    --empty-unused-memory-level 1 --exit-duration-in-mins 235
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
    --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather
    --tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --data-cache-path {tmp}/benchmark_cache
    --tiktoken-pattern v2 --split "'99,1,0'" --no-create-attention-mask-in-dataloader --no-mmap-bin-files
    --num-workers 1
    --log-interval 1 --eval-iters 32 --eval-interval 100 --save-interval 1000 --log-throughput --profile
    --profile-step-start 4 --profile-step-end 6 --ckpt-format torch_dist --distributed-timeout-minutes 60
    --save {tmp}/checkpoints --load {tmp}/checkpoints --tensorboard-dir {tmp}/tensorboard""",
    replaced={"checkpoints/…, tensorboard_logs/…, ${PWD}/benchmark_cache_…": "paths under {tmp}"})

MIXTRAL_8X7B = Script(
    "mixtral_8x7b", "examples/mixtral/train_mixtral_8x7b_distributed.sh", 32,
    "tp 1 × pp 4 × dp 8 with ep 8: the layout its README recommends for training (TP1EP8PP4), "
    "4 nodes of 8",
    """--use-mcore-models --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope
    --swiglu --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8
    --no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000
    --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
    --tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --split 99990,8,2
    --micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000 --lr-decay-iters 320000
    --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-iters 500 --clip-grad 1.0 --bf16
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8
    --use-distributed-optimizer --sequence-parallel
    --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --save {tmp}/checkpoints
    --load {tmp}/checkpoints --tensorboard-dir {tmp}/checkpoints/tensorboard --no-load-optim --no-load-rng""",
    replaced={"--tokenizer-type Llama2Tokenizer --tokenizer-model $2": "--tokenizer-type NullTokenizer "
              "--vocab-size 32000: " + MOCK_TOKENIZER,
              "--data-path $3": "--mock-data", "$1 (checkpoint)": "a path under {tmp}"})

GPT_OSS = Script(
    "gpt_oss", "examples/gptoss/02_train.sh", 8,
    "pp 8: the script sets the pipeline size to its world, one node of 8",
    """--no-masked-softmax-fusion --transformer-impl transformer_engine --disable-bias-linear
    --untie-embeddings-and-output-weights --no-rope-fusion --normalization RMSNorm --num-layers 12
    --hidden-size 512 --ffn-hidden-size 2048 --num-attention-heads 64 --group-query-attention
    --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 --use-mcore-models
    --rotary-percent 1.0 --rope-type rope --position-embedding-type rope --rotary-base 10000
    --no-bias-gelu-fusion --export-force-local-attention --no-bias-dropout-fusion --quick-geglu
    --glu-linear-offset 1.0 --softmax-type learnable --window-attn-skip-freq 2
    --activation-func-clamp-value 7.0 --window-size 127,0 --enable-gpt-oss
    --num-experts 4 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
    --moe-ffn-hidden-size 2048 --moe-router-dtype fp32 --moe-z-loss-coeff 1e-3 --moe-permute-fusion
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --data-cache-path {tmp}/benchmark_cache
    --tiktoken-pattern v2 --split "'99,1,0'" --no-create-attention-mask-in-dataloader --no-mmap-bin-files
    --num-workers 1
    --micro-batch-size 1 --global-batch-size 128 --lr 1.0e-5 --train-samples 1953125000
    --lr-decay-samples 1949218748 --lr-decay-style cosine --min-lr 1.0e-6 --weight-decay 0.1
    --lr-warmup-fraction 0.05 --clip-grad 1.0 --bf16 --use-flash-attn --attention-softmax-in-fp32
    --accumulate-allreduce-grads-in-fp32 --disable-bf16-reduced-precision-matmul --recompute-activations
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 --expert-model-parallel-size 1
    --sequence-parallel --context-parallel-size 1 --use-distributed-optimizer --fp8-format hybrid
    --fp8-param-gather --fp8-amax-compute-algo max --fp8-amax-history-len 1024
    --log-interval 1 --save-interval 10000 --eval-interval 50000000 --eval-iters 0 --save {tmp}/checkpoints
    --tensorboard-dir {tmp}/checkpoints/tensorboard --moe-per-layer-logging --no-load-optim --no-load-rng
    --log-throughput""",
    replaced={"--checkpoint-path (must exist), ${PWD}/benchmark_cache_…": "paths under {tmp}"})

DEEPSEEK_V2_LITE = Script(
    "deepseek_v2_lite", "examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-V2-Lite.sh", 8,
    "ep 8 over one node of 8 (dp 8): its 64 experts, 8 a rank",
    """--save-interval 100000 --attention-dropout 0.0 --hidden-dropout 0.0 --micro-batch-size 1 --bf16
    --no-masked-softmax-fusion --disable-bias-linear --untie-embeddings-and-output-weights
    --position-embedding-type rope --no-rope-fusion --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
    --num-layers 27 --hidden-size 2048 --ffn-hidden-size 10944 --num-attention-heads 16 --kv-channels 16
    --multi-latent-attention --kv-lora-rank 512 --v-head-dim 128 --qk-head-dim 128 --qk-layernorm
    --qk-pos-emb-head-dim 64 --num-experts 64 --moe-layer-freq ([0]+[1]*26) --moe-ffn-hidden-size 1408
    --moe-grouped-gemm --moe-router-score-function softmax --moe-router-topk 6
    --moe-router-topk-scaling-factor 1.0 --moe-router-pre-softmax --moe-shared-expert-intermediate-size 2816
    --moe-aux-loss-coeff 1e-3 --moe-token-dispatcher-type alltoall --moe-token-drop-policy probs
    --moe-router-load-balancing-type seq_aux_loss --seq-length 1024 --max-position-embeddings 1024
    --tokenizer-type NullTokenizer --vocab-size 102400 --make-vocab-size-divisible-by 3200
    --attention-softmax-in-fp32 --use-mcore-models --rotary-percent 1.0 --rotary-base 10000
    --rotary-scaling-factor 40 --mscale 0.707 --mscale-all-dim 0.707 --sequence-parallel""",
    replaced={"--tokenizer-type HuggingFaceTokenizer (deepseek-ai/DeepSeek-V2-Lite)":
              "--tokenizer-type NullTokenizer --vocab-size 102400: " + MOCK_TOKENIZER},
    paired="""--expert-model-parallel-size 8 --global-batch-size 256 --train-iters 1000 --lr 1e-4
    --lr-decay-style cosine --use-distributed-optimizer --mock-data""")

QWEN3_30B_A3B = Script(
    "qwen3_30b_a3b", "examples/rl/model_configs/qwen3_30b_a3b_moe.sh", 8,
    "tp 4 × dp 2 with ep 2: the config's TP, PP, EP defaults on its one required node",
    """--seq-length 8192 --bf16 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1
    --expert-model-parallel-size 2 --attention-backend flash --transformer-impl transformer_engine
    --te-rng-tracker --tokenizer-type NullTokenizer --untie-embeddings-and-output-weights --num-layers 48
    --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 32 --kv-channels 128
    --max-position-embeddings 8192 --group-query-attention --num-query-groups 4 --normalization RMSNorm
    --norm-epsilon 1e-6 --position-embedding-type rope --rotary-percent 1.0 --rotary-base 1000000
    --use-rotary-position-embeddings --swiglu --disable-bias-linear --num-experts 128 --moe-router-topk 8
    --moe-ffn-hidden-size 768 --moe-aux-loss-coeff 0.001 --moe-router-load-balancing-type aux_loss
    --attention-dropout 0.0 --hidden-dropout 0.0 --no-masked-softmax-fusion --attention-softmax-in-fp32
    --vocab-size 151936 --make-vocab-size-divisible-by 128 --qk-layernorm --moe-token-dispatcher-type alltoall
    --moe-layer-freq 1 --optimizer adam --adam-beta1 0.9 --adam-beta2 0.999 --adam-eps 1e-8 --lr 1e-6
    --min-lr 1e-7 --lr-warmup-samples 0 --clip-grad 1.0 --weight-decay 0.01 --no-load-optim
    --ckpt-format torch_dist""",
    replaced={"--tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen3-30B-A3B":
              "--tokenizer-type NullTokenizer (the config gives --vocab-size): " + MOCK_TOKENIZER},
    paired="--micro-batch-size 1 --global-batch-size 256 --train-iters 20 --mock-data",
    dropped={"--inference-max-seq-length --inference-max-requests": "size train_rl.py's inference engine",
             "--pretrained-checkpoint --no-use-tokenizer-model-from-checkpoint-args --dist-ckpt-strictness":
             "load the RL run's starting checkpoint",
             "--tokenizer-hf-include-special-tokens": "a HuggingFace tokenizer option (no tokenizer is read)"})

LLAMA31_8B_INSTRUCT = Script(
    "llama3p1_8b_instruct", "examples/rl/model_configs/llama3p1_8b_instruct.sh", 32,
    "tp 8 × dp 4: the config's TP 8, PP 1 on the 4 nodes it requires",
    """--disable-bias-linear --ckpt-format torch_dist --seq-length 4096 --add-qkv-bias --normalization RMSNorm
    --group-query-attention --num-query-groups 8 --no-masked-softmax-fusion --attention-softmax-in-fp32
    --attention-dropout 0.0 --hidden-dropout 0.0 --untie-embeddings-and-output-weights --weight-decay 0.1
    --position-embedding-type rope --rotary-percent 1.0 --rotary-base 500000 --use-rotary-position-embeddings
    --swiglu --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --max-position-embeddings 131072 --tokenizer-type NullTokenizer --vocab-size 128256 --lr 3e-7
    --make-vocab-size-divisible-by 128 --clip-grad 1.0""",
    replaced={"--tokenizer-type HuggingFaceTokenizer --tokenizer-model unsloth/Meta-Llama-3.1-8B-Instruct":
              "--tokenizer-type NullTokenizer --vocab-size 128256: " + MOCK_TOKENIZER},
    paired="""--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --bf16 --micro-batch-size 1
    --global-batch-size 512 --train-iters 16 --mock-data""",
    dropped={"--inference-max-seq-length --inference-max-requests": "size train_rl.py's inference engine",
             "--pretrained-checkpoint": "loads the RL run's starting checkpoint",
             "--rl-use-sequence-packing --rl-sequence-packing-algo fifo": "pack train_rl.py's rollouts"})

SCRIPTS = [GPT3_175B, LLAMA3_8B, MIXTRAL_8X7B, GPT_OSS, DEEPSEEK_V2_LITE, QWEN3_30B_A3B, LLAMA31_8B_INSTRUCT]

# How far each gets once the flags that stopped it are taken out (reasons a reader can check).
VARIANTS = [
    without(GPT3_175B, "gpt3_175b_schedule", "--global-batch-size out: Megatron 0.19 refuses it beside "
            "--step-batch-size-schedule, as minitron does", "--global-batch-size 1536"),
    without(LLAMA3_8B, "llama3_8b_bf16", "the script's DTYPE set to bf16: its four fp8 flags are not passed",
            "--fp8-format hybrid", "--fp8-amax-history-len 1024", "--fp8-amax-compute-algo max",
            "--fp8-param-gather"),
]

ALL = {s.name: s for s in SCRIPTS + VARIANTS}
