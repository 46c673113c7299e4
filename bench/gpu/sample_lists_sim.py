"""How long the GPU sampler's candidate lists get (src/backend/cuda/sample.cu, list_threshold), on the host.

sample_bench.c's first 8 rows regenerated with its splitmix generator (vocab 128,256), the weights
exp(l - max) in numpy float32 (not the kernel's Cephes polynomial: close, not bit-equal), and each
4,096-value slice's list for K = top_k = 50 as level 0 of the radix select leaves it: every weight whose
top `bits` bits under bit 30 are at or above the bucket holding the slice's 50th largest. Prints U (the
union's size, the finisher's input) a row for level-0 widths of 8 bits (list_threshold) and 10 bits
(list_threshold_fine). Also the largest slice count: under kListCap (512), level 0 is where list_threshold stops.
Usage: python3 bench/gpu/sample_lists_sim.py   (numpy; ~1 minute)
"""
import numpy as np, sys
V=128256
# reproduce sample_bench's generator (splitmix-like); vectorized with uint64 arithmetic
M=(1<<64)-1
def uni(a,b,c):
    a=np.uint64(a); c=np.uint64(c)
    with np.errstate(over='ignore'):
        z=(a*np.uint64(0x9E3779B97F4A7C15)) ^ ((b+np.uint64(0x632BE59BD9B4E019))*np.uint64(0xBF58476D1CE4E5B9)) ^ (c*np.uint64(0x94D049BB133111EB))
        z=(z^(z>>np.uint64(30)))*np.uint64(0xBF58476D1CE4E5B9)
        z=(z^(z>>np.uint64(27)))*np.uint64(0x94D049BB133111EB)
        z^=z>>np.uint64(31)
    return (z>>np.uint64(11)).astype(np.float64)*(1.0/9007199254740992.0)
i=np.arange(V,dtype=np.uint64)
head=300/V
for bits0 in (8, 10):
  res=[]
  for r in range(8):
    s=sum(uni(r+11,i,j) for j in range(4)); s=(s-2.0)*1.7
    s=s+np.where(uni(r+11,i,4)<head, 6.0+6.0*uni(r+11,i,5), 0.0)
    l=s.astype(np.float32); w=np.exp((l-l.max()).astype(np.float32)).astype(np.float32)
    bitsv=w.view(np.uint32)
    nu=0; K=50; mx=0
    for c in range(0,V,4096):
        e=bitsv[c:c+4096]
        # level 0 only: bucket = bits>>(30-bits0) ; threshold = lowest bucket where count >= K
        sh=30-bits0
        b=e>>sh
        vals=np.sort(b)[::-1]
        kb=vals[K-1]
        cnt=(b>=kb).sum()
        nu+=cnt; mx=max(mx,int(cnt))
    res.append((int(nu), mx))
  print(f"{bits0:2d} bits: U a row {[u for u, _ in res]}, largest slice list {max(m for _, m in res)}")
