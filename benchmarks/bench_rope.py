"""RoPE apply vs a copy and the peers: see posenc.bench.rope_benchmark."""

from posenc.bench import main_rope

if __name__ == "__main__":
    main_rope()
