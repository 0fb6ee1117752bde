import torch, posenc, posenc.kernels as K
from torch.utils.benchmark import Timer
DEV = "cuda" if torch.cuda.is_available() else "cpu"
rope = posenc.RoPE(head_dim=128)
q = torch.randn(1, 32, 2048, 128, device=DEV, dtype=torch.bfloat16); k = torch.randn(1, 8, 2048, 128, device=DEV, dtype=torch.bfloat16)
pos = torch.arange(2048, device=DEV)
for flag in (True, False):
    K.TRITON_ENABLED = flag
    t = Timer("rope.rotate(q, k, pos, pos)", globals=dict(rope=rope, q=q, k=k, pos=pos)).blocked_autorange(min_run_time=0.3)
    print(f"RoPE.rotate T=2048 bf16 triton={flag}: {t.median*1e3:.3f} ms")
