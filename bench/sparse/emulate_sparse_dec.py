# Lane-level host emulation of src/backend/cuda/attention_sparse.cu's sparse_dec_kernel, one CTA over
# already-gathered keys (the kernel's step 2 and 3): shared-memory bytes laid out as the kernel lays them
# (stages of [K, V][64][2 D + 16], P^T [R][72]), ldmatrix (.trans) and mma.m16n8k16 per the PTX ISA's
# fragment layouts, and the kernel's addresses, loops, masking, online softmax, per-thread l and its
# reduction copied as written; the result against a float64 softmax. Run: python3 bench/sparse/emulate_sparse_dec.py
# (needs numpy). A mutated address (V^T's ldmatrix lanes) or a lost l lane makes it fail. Written without
# a GPU, before the kernel's first device run.
# Lane-level emulation of attention_sparse.cu's sparse_dec_kernel for one CTA (one chunk), f16 pages:
# ldmatrix / mma.m16n8k16 per the PTX ISA fragment layouts, the kernel's addresses and loops as written.
import numpy as np, math
rng = np.random.default_rng(1)
def run(D, NQ, nh, nkeys, ST=3):
    kThreads, kKeys, kPS = 128, 64, 72
    R = 8*NQ; KT = D//16; MB = D//64; RB = 2*D+16; TB = kKeys*RB
    LCPR = 2*D//16; RPP = kThreads//LCPR; LCPT = kKeys//RPP
    # global: kept rows (already gathered): K, V [nkeys, D] f16, q [nh, D]
    K = rng.uniform(-1,1,(nkeys,D)).astype(np.float16); V = rng.uniform(-1,1,(nkeys,D)).astype(np.float16)
    Q = rng.uniform(-2,2,(nh,D)).astype(np.float16)  # (bf16->f16 rounding skipped: use f16 directly)
    scale = 1/math.sqrt(D); qscale = np.float32(scale*1.4426950408889634)
    smem = np.zeros(ST*2*TB + R*kPS*2, dtype=np.uint8)
    sP_off = ST*2*TB
    def st_bytes(off, arr16):  # store f16 array bytes
        b = arr16.astype(np.float16).tobytes(); smem[off:off+len(b)] = np.frombuffer(b, np.uint8)
    def ld16(off): return np.frombuffer(smem[off:off+2].tobytes(), np.float16)[0]
    ntiles = (nkeys + kKeys - 1)//kKeys
    def load_tile(tile, st):
        for tid in range(kThreads):
            part = tid % LCPR; jrow = tid // LCPR
            for u in range(LCPT):
                key = tile*kKeys + jrow + u*RPP
                so = st*2*TB + u*RPP*RB + jrow*RB + part*16
                kb = K[key, part*8:part*8+8] if key < nkeys else np.zeros(8, np.float16)
                vb = V[key, part*8:part*8+8] if key < nkeys else np.zeros(8, np.float16)
                st_bytes(so, kb); st_bytes(so+TB, vb)
    def ldsm(addrs, trans, nmat):
        # addrs[lane]: row address for matrix lane//8, row lane%8; returns regs[lane][i] = (lo, hi) f16 pair
        out = [[None]*nmat for _ in range(32)]
        for i in range(nmat):
            M = np.array([[ld16(addrs[8*i+r] + 2*c) for c in range(8)] for r in range(8)], np.float16)
            if trans: M = M.T
            for t in range(32):
                out[t][i] = (M[t//4, 2*(t%4)], M[t//4, 2*(t%4)+1])
        return out
    def mma(acc, a, b):  # acc[lane][4], a[lane][4 pairs], b[lane][2 pairs] -> per PTX layout
        A = np.zeros((16,16), np.float32); B = np.zeros((16,8), np.float32)
        for t in range(32):
            g, c = t//4, t%4
            for (r, k0), reg in zip([(g,2*c),(g+8,2*c),(g,2*c+8),(g+8,2*c+8)], a[t]):
                A[r,k0], A[r,k0+1] = reg
            for k0, reg in zip([2*c, 2*c+8], b[t]):
                B[k0,g], B[k0+1,g] = reg
        C = A.astype(np.float64) @ B.astype(np.float64)
        for t in range(32):
            g, c = t//4, t%4
            acc[t][0] += C[g,2*c]; acc[t][1] += C[g,2*c+1]; acc[t][2] += C[g+8,2*c]; acc[t][3] += C[g+8,2*c+1]
    # per-thread state
    qb = {}
    for tid in range(kThreads):
        lane=tid&31; g=lane>>2; c4=lane&3
        for nq in range(NQ):
            col = 8*nq+g; ok = col < nh
            for kk in range(KT):
                for hf in range(2):
                    d = 16*kk+2*c4+8*hf
                    qb[tid,nq,kk,hf] = (Q[col,d], Q[col,d+1]) if ok else (np.float16(0), np.float16(0))
    m = np.full((kThreads,NQ,2), -np.inf, np.float32); lp = np.zeros((kThreads,NQ,2), np.float32)
    o = np.zeros((kThreads,MB,NQ,4), np.float32)
    for i in range(ST-1):
        if i < ntiles: load_tile(i, i)
    for tile in range(ntiles):
        st = tile % ST
        if tile+ST-1 < ntiles: load_tile(tile+ST-1, (tile+ST-1)%ST)
        sk = st*2*TB; sv = sk+TB
        sc = np.zeros((kThreads,NQ,4), np.float32)
        sMax = np.zeros((4,R), np.float32)
        for warp in range(4):
            lanes = range(32)
            for kk in range(KT):
                addrs = [sk + (16*warp + (l&7) + ((l>>3)&1)*8)*RB + (l>>4)*16 + 32*kk for l in lanes]
                a = ldsm(addrs, False, 4)
                for nq in range(NQ):
                    acc = [list(sc[32*warp+l,nq]) for l in lanes]
                    b = [[qb[32*warp+l,nq,kk,0], qb[32*warp+l,nq,kk,1]] for l in lanes]
                    mma(acc, a, b)
                    for l in lanes: sc[32*warp+l,nq] = acc[l]
            for l in lanes:
                tid=32*warp+l; g=l>>2
                key0 = tile*kKeys+16*warp+g
                for nq in range(NQ):
                    for e in range(4):
                        v = np.float32(sc[tid,nq,e]*qscale)
                        sc[tid,nq,e] = v if key0+8*(e>>1) < nkeys else -np.inf
            for nq in range(NQ):
                for c4 in range(4):
                    for ci in range(2):
                        v = max(max(sc[32*warp+gg*4+c4,nq,ci], sc[32*warp+gg*4+c4,nq,2+ci]) for gg in range(8))
                        sMax[warp, 8*nq+2*c4+ci] = v
        alpha = np.zeros((kThreads,NQ,2), np.float32)
        for tid in range(kThreads):
            l=tid&31; c4=l&3
            for nq in range(NQ):
                for ci in range(2):
                    col=8*nq+2*c4+ci
                    tmax = sMax[:,col].max(); mn = max(m[tid,nq,ci], tmax)
                    alpha[tid,nq,ci] = np.exp2(np.float32(m[tid,nq,ci]-mn)); m[tid,nq,ci]=mn
                    sc[tid,nq,ci] = np.exp2(np.float32(sc[tid,nq,ci]-mn)); sc[tid,nq,2+ci] = np.exp2(np.float32(sc[tid,nq,2+ci]-mn))
                    lp[tid,nq,ci] = np.float32(lp[tid,nq,ci]*alpha[tid,nq,ci] + np.float32(sc[tid,nq,ci]+sc[tid,nq,2+ci]))
        for tid in range(kThreads):
            l=tid&31; g=l>>2; c4=l&3; warp=tid>>5
            for nq in range(NQ):
                for e in range(4):
                    st_bytes(sP_off + ((8*nq+2*c4+(e&1))*kPS + 16*warp + g + 8*(e>>1))*2, np.array([sc[tid,nq,e]],np.float16))
        for tid in range(kThreads):
            for mb in range(MB):
                for nq in range(NQ):
                    for e in range(4): o[tid,mb,nq,e] *= alpha[tid,nq,e&1]
        for warp in range(4):
            lanes=range(32)
            for j in range(kKeys//16):
                b = {}
                for nq in range(NQ):
                    addrs = [sP_off + ((l&7)*kPS + ((l>>3)&1)*8)*2 + (8*nq*kPS + 16*j)*2 for l in lanes]
                    b[nq] = ldsm(addrs, False, 2)
                for mb in range(MB):
                    addrs = [sv + ((l&7) + ((l>>4)<<3))*RB + (warp*(D//4) + ((l>>3)&1)*8)*2 + 16*j*RB + 32*mb for l in lanes]
                    a = ldsm(addrs, True, 4)
                    for nq in range(NQ):
                        acc = [list(o[32*warp+l,mb,nq]) for l in lanes]
                        mma(acc, a, b[nq])
                        for l in lanes: o[32*warp+l,mb,nq] = acc[l]
    # l reduction and outputs
    sL = np.zeros((4,R), np.float32)
    for warp in range(4):
        for nq in range(NQ):
            for c4 in range(4):
                for ci in range(2):
                    sL[warp,8*nq+2*c4+ci] = sum(lp[32*warp+gg*4+c4,nq,ci] for gg in range(8))
    out = np.full((nh,D), np.nan)
    for tid in range(kThreads):
        l=tid&31; g=l>>2; c4=l&3; warp=tid>>5
        for nq in range(NQ):
            for ci in range(2):
                col=8*nq+2*c4+ci
                if col>=nh: continue
                L = sL[:,col].sum()
                for mb in range(MB):
                    d0 = warp*(D//4)+16*mb+g
                    out[col,d0] = o[tid,mb,nq,ci]/L; out[col,d0+8] = o[tid,mb,nq,2+ci]/L
    # reference
    S = (Q.astype(np.float64) @ K.astype(np.float64).T) * scale
    P = np.exp(S - S.max(axis=1, keepdims=True)); ref = (P @ V.astype(np.float64)) / P.sum(axis=1, keepdims=True)
    err = np.abs(out-ref).max()
    print(f"D {D} NQ {NQ} heads {nh} keys {nkeys}: max |emu - ref| {err:.2e}, nan {np.isnan(out).sum()}")
    assert err < 3e-3 and not np.isnan(out).any()
run(64, 1, 4, 70)
run(64, 1, 8, 64, ST=2)
run(128, 1, 1, 130)
run(64, 2, 12, 33)
run(128, 2, 16, 200, ST=4)
print("ok")
