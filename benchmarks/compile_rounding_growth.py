"""How fast SGD amplifies rounding: compiled vs eager against eager vs an eager copy perturbed by 1e-7.

    OMP_NUM_THREADS=1 python benchmarks/compile_rounding_growth.py lipconvnet-20 aot_eager

Three copies of one randomly initialised LipConvnet (width 8) take the same SGD steps (lr 0.1,
the recipe's optimiser, batch 16): eager, compiled by ``torch.compile`` with the given backend,
and eager with every parameter multiplied by ``1 + 1e-7·N(0, 1)``.  Per step it prints the
three losses and the largest relative parameter difference of each copy from the eager one:
when the perturbed copy drifts as far as the compiled one, the drift is the training's
amplification of rounding, not a difference of the compiled map.
"""
import sys, copy, torch, torch.nn.functional as F
from lipcli.host.models import create_model
from lipcli.bench.step import recipe_optimizer
arch, backend = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
m = create_model(arch, num_classes=10, width=8).train()
t = copy.deepcopy(m); p2 = copy.deepcopy(m)
with torch.no_grad():
    for q in p2.parameters(): q.mul_(1 + 1e-7 * torch.randn_like(q))
c = torch.compile(t, backend=backend)
opts = [recipe_optimizer(z) for z in (m, t, p2)]
gen = torch.Generator().manual_seed(0)
for step in range(8):
    x = torch.rand(16,3,32,32, generator=gen); y = torch.randint(0,10,(16,), generator=gen)
    losses = []
    for fwd, o in zip((m, c, p2), opts):
        o.zero_grad(); l = F.cross_entropy(fwd(x), y); l.backward(); o.step(); losses.append(float(l))
    def rel(a, b): return max(float((p.detach()-q.detach()).abs().max()/(p.detach().abs().max()+1e-30)) for p, q in zip(a.parameters(), b.parameters()))
    print(step, "loss", losses, "rel compiled", f"{rel(m,t):.2e}", "rel perturbed-eager", f"{rel(m,p2):.2e}", flush=True)
