"""Score-bias attention vs bias-free SDPA: see posenc.bench.attention_benchmark."""

from posenc.bench import main_attention

if __name__ == "__main__":
    main_attention()
