# Lane-level emulation of src/backend/cuda/dsa_indexer.cu's dsa_score_kernel (issue 15): its shared-memory
# layout (sQ [H][d_I + 8], sK [128][d_I + 8] f16), ldmatrix addresses, mma.m16n8k16 fragments per the PTX ISA and
# the epilogue (per-thread head sums, the quad, the writer lane), for one 128-key tile on integer inputs, against
# a direct float64 computation: exact for d_I 64 / 128, H_I 16 / 32 / 64. A mutated B address fails it. Needs numpy.
# Lane-level emulation of dsa_score_kernel's shared-memory layout, ldmatrix addresses, mma.m16n8k16
# fragments and epilogue for one 128-key tile, against a direct computation.
import numpy as np
def run(DI, NT, seed):
    rng = np.random.default_rng(seed)
    H = 8*NT; RS = DI + 8; KT = DI//16
    Kv = rng.integers(-4, 5, size=(128, DI)).astype(np.float16)   # widened codes
    Q = rng.integers(-3, 4, size=(H, DI)).astype(np.float16)
    w = rng.integers(-2, 4, size=H).astype(np.float32)
    scale = rng.choice([0.5, 1.0, 2.0], size=128).astype(np.float32)
    # shared memory in halves: sQ [H][RS], sK [128][RS]
    sQ = np.zeros(H*RS, np.float16); sK = np.zeros(128*RS, np.float16)
    for h in range(H): sQ[h*RS:h*RS+DI] = Q[h]
    # sK written as the kernel does: piece part of key kk at kk*RS + part*16 (dims part*16 .. +15)
    PARTS = DI//16
    for c in range(128*PARTS):
        kk, part = c//PARTS, c%PARTS
        sK[kk*RS+part*16: kk*RS+part*16+16] = Kv[kk, part*16:part*16+16]
    sQ_b = 0; sK_b = 1<<20  # byte bases (separate spaces)
    def ld16(addr):
        if addr >= sK_b: return sK[(addr-sK_b)//2]
        return sQ[addr//2]
    def ldsm4(addrs):
        out = [[None]*4 for _ in range(32)]
        for i in range(4):
            M = [[ld16(addrs[8*i+r]+2*c) for c in range(8)] for r in range(8)]
            for t in range(32): out[t][i] = (M[t//4][2*(t%4)], M[t//4][2*(t%4)+1])
        return out
    def mma(acc, a, b0, b1):
        A = np.zeros((16,16)); B = np.zeros((16,8))
        for t in range(32):
            g, c = t//4, t%4
            for (r,k0),reg in zip([(g,2*c),(g+8,2*c),(g,2*c+8),(g+8,2*c+8)], a[t]): A[r,k0],A[r,k0+1] = reg
            for k0,reg in zip([2*c,2*c+8],[b0[t],b1[t]]): B[k0,g],B[k0+1,g] = reg
        C = A @ B
        for t in range(32):
            g, c = t//4, t%4
            acc[t][0]+=C[g,2*c]; acc[t][1]+=C[g,2*c+1]; acc[t][2]+=C[g+8,2*c]; acc[t][3]+=C[g+8,2*c+1]
    out = np.full(128, np.nan)
    for warp in range(4):
        a_lane = [((32*warp + (l&7) + ((l>>3)&1)*8)*RS + (l>>4)*8)*2 for l in range(32)]
        b_lane = [(((l&7))*RS + (l>>3)*8)*2 for l in range(32)]
        acc = [[[ [0.0]*4 for _ in range(32)] for nt in range(NT)] for mt in range(2)]
        for k2 in range(KT//2):
            a = [[ldsm4([sK_b + a_lane[l] + (16*mt*RS + 16*(2*k2+kq))*2 for l in range(32)]) for kq in range(2)] for mt in range(2)]
            for nt in range(NT):
                b = ldsm4([sQ_b + b_lane[l] + (8*nt*RS + 32*k2)*2 for l in range(32)])
                for mt in range(2):
                    mma(acc[mt][nt], a[mt][0], [x[0] for x in b], [x[1] for x in b])
                    mma(acc[mt][nt], a[mt][1], [x[2] for x in b], [x[3] for x in b])
        for mt in range(2):
            for hf in range(2):
                parts = []
                for l in range(32):
                    g, c4 = l>>2, l&3; part = np.float32(0)
                    for nt in range(NT):
                        for ci in range(2):
                            d = acc[mt][nt][l][2*hf+ci]
                            part = np.float32(part + w[8*nt+2*c4+ci]*(d if d > 0 else 0.0))
                    parts.append(part)
                for l in range(32):
                    g, c4 = l>>2, l&3
                    q = [parts[(l & ~3) | i] for i in range(4)]
                    tot = (q[0]+q[1]) + (q[2]+q[3])
                    kk = 32*warp + 16*mt + 8*hf + g
                    if c4 == 2*mt + hf:
                        assert np.isnan(out[kk]); out[kk] = tot*scale[kk]
    dots = Kv.astype(np.float64) @ Q.astype(np.float64).T   # [128, H]
    ref = (np.maximum(dots, 0) * w).sum(1) * scale
    err = np.abs(out - ref).max()
    assert not np.isnan(out).any() and err == 0, err
    print(f"DI {DI} H {H}: 128 keys exact")
run(64, 2, 1); run(128, 4, 2); run(128, 8, 3)
