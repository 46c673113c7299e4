# Emulation of dsa_indexer.cu's top-k kernels (issue 15), threads serialized: the one-CTA kernel (12-bit
# histogram, digit search by block scan, the bin's keys, 3 radix passes, the page-order emission with equal-key
# ranks) and the cluster kernel (slices of pages, histograms summed over the cluster, per-slice offsets), against
# a sort under 'score descending, position ascending' (NaN as -inf) on 300 random cases each: ties, all equal,
# +-0, NaN, +-inf, near-equal floats, n <= k, k + 1, bins past the shared-memory limit. Plain Python (slow: minutes).
# emulation of dsa_topk_kernel's algorithm (threads serialized), against a sort
import random, struct, math
NT=1024; KB=4096; KCAND=12288
def okey(f):
    if f!=f: f=-math.inf
    if f==0.0: f=0.0
    u=struct.unpack('<I',struct.pack('<f',f))[0]
    return (~u)&0xffffffff if u&0x80000000 else u|0x80000000
def find_digit(h,nbins,krem):
    bpt = nbins//NT if nbins>NT else 1
    loc=[0]*NT
    for tid in range(NT):
        b0=tid*bpt
        if b0<nbins: loc[tid]=sum(h[b0:b0+bpt])
    tot=sum(loc); res=None; incl=0
    for tid in range(NT):
        incl+=loc[tid]; ge=tot-(incl-loc[tid]); above=ge-loc[tid]; b0=tid*bpt
        if b0<nbins and above<krem<=ge:
            acc=above
            for b in range(bpt-1,-1,-1):
                if acc+h[b0+b]>=krem: 
                    assert res is None; res=(b0+b,acc); break
                acc+=h[b0+b]
    assert res is not None
    return res
def topk(sc,n,K,bs):
    keys=[okey(x) for x in sc[:n]]
    allsel = n<=K; thr=0; krem=0
    if not allsel:
        h=[0]*KB
        for k in keys: h[k>>20]+=1
        b1,ab=find_digit(h,KB,K); krem=K-ab
        insm = h[b1]<=KCAND
        cand=[k for k in keys if (k>>20)==b1] if insm else keys
        prefix=b1<<20; mask=0xFFF00000
        for shift,width in ((12,8),(4,8),(0,4)):
            nb=1<<width; hh=[0]*nb
            for k in cand:
                if (k&mask)==prefix: hh[(k>>shift)&(nb-1)]+=1
            d,ab=find_digit(hh,nb,krem)
            prefix|=d<<shift; mask|=(nb-1)<<shift; krem-=ab
        thr=prefix
    np_=(n+bs-1)//bs
    out=[]; ents=[]; eq_run=0
    for j0 in range(0,np_,NT):
        # per thread
        gts=[];eqs=[]
        for tid in range(NT):
            j=j0+tid; k0=j*bs; cnt=min(bs,n-k0) if j<np_ else 0
            gt=[];eq=[]
            for b in range(cnt):
                if allsel: gt.append(b); continue
                k=keys[k0+b]
                if k>thr: gt.append(b)
                if k==thr: eq.append(b)
            gts.append(gt);eqs.append(eq)
        excl=eq_run
        for tid in range(NT):
            keep=krem-excl
            sel=set(gts[tid])
            for b in eqs[tid]:
                if keep>0: sel.add(b); keep-=1
            excl+=len(eqs[tid])
            j=j0+tid
            if sel:
                out += [j*bs+b for b in sorted(sel)]
                ents.append((j,sum(1<<b for b in sel)))
        eq_run=excl
    return out,ents
def ref(sc,n,K):
    f=lambda x: -math.inf if x!=x else x
    o=sorted(range(n),key=lambda i:(-f(sc[i]),i))[:K]
    return sorted(o)
random.seed(1)
for it in range(300):
    n=random.choice([1,5,100,2047,2048,2049,3000,random.randint(1,20000)])
    K=random.choice([1,5,64,2048])
    bs=random.choice([16,7,64,1])
    mode=random.randint(0,4)
    if mode==0: sc=[random.uniform(-1,1) for _ in range(n)]
    elif mode==1: sc=[float(random.randint(-3,3)) for _ in range(n)]
    elif mode==2: sc=[1.0]*n
    elif mode==3: sc=[random.choice([0.0,-0.0,math.nan,math.inf,-math.inf,1.5]) for _ in range(n)]
    else: sc=[struct.unpack('<f',struct.pack('<f',random.uniform(1,1.0001)))[0] for _ in range(n)]
    o,e=topk(sc,n,K,bs); r=ref(sc,n,K)
    assert o==r,(it,n,K,bs,mode)
    # entries
    pages=sorted(set(p//bs for p in r))
    assert [x[0] for x in e]==pages
print("ok")

# the cluster variant: slices of pages, radix hist summed over slices, emission per slice with offsets
CL=8
def emit_slice(keys,n,bs,allsel,thr,krem,pg_lo,pg_hi,eq_run):
    out=[];ents=[];eqn=0
    for j in range(pg_lo,pg_hi):
        k0=j*bs; cnt=min(bs,n-k0); sel=set()
        for b in range(cnt):
            if allsel: sel.add(b); continue
            k=keys[k0+b]
            if k>thr: sel.add(b)
            if k==thr:
                if krem-(eq_run+eqn)>0: sel.add(b)
                eqn+=1
        if sel: out+=[k0+b for b in sorted(sel)]; ents.append(j)
    return out,ents
def topk_cluster(sc,n,K,bs):
    keys=[okey(x) for x in sc[:n]]
    allsel=n<=K; thr=0; krem=0
    np_=(n+bs-1)//bs; pp=(np_+CL-1)//CL
    sl=[(min(np_,r*pp),min(np_,min(np_,r*pp)+pp)) for r in range(CL)]
    xs=[(min(n,a*bs),min(n,b*bs)) for a,b in sl]
    if not allsel:
        h=[0]*KB
        for k in keys: h[k>>20]+=1
        b1,ab=find_digit(h,KB,K); krem=K-ab
        insm=h[b1]<=KCAND
        cands=[[k for k in keys[x0:x1] if (not insm) or (k>>20)==b1] for x0,x1 in xs]
        prefix=b1<<20; mask=0xFFF00000
        for shift,width in ((12,8),(4,8),(0,4)):
            nb=1<<width; hh=[0]*nb
            for c in cands:
                for k in c:
                    if (k&mask)==prefix: hh[(k>>shift)&(nb-1)]+=1
            d,ab=find_digit(hh,nb,krem)
            prefix|=d<<shift; mask|=(nb-1)<<shift; krem-=ab
        thr=prefix
    eqs=[0 if allsel else sum(1 for k in keys[x0:x1] if k==thr) for x0,x1 in xs]
    out=[];ents=[]
    for r in range(CL):
        o,e=emit_slice(keys,n,bs,allsel,thr,krem,sl[r][0],sl[r][1],sum(eqs[:r]))
        out+=o; ents+=e
    return out,ents
random.seed(2)
for it in range(300):
    n=random.choice([1,5,100,2047,2048,2049,3000,random.randint(1,20000)])
    K=random.choice([1,5,64,2048])
    bs=random.choice([16,7,64,1])
    mode=random.randint(0,4)
    if mode==0: sc=[random.uniform(-1,1) for _ in range(n)]
    elif mode==1: sc=[float(random.randint(-3,3)) for _ in range(n)]
    elif mode==2: sc=[1.0]*n
    elif mode==3: sc=[random.choice([0.0,-0.0,math.nan,math.inf,-math.inf,1.5]) for _ in range(n)]
    else: sc=[struct.unpack('<f',struct.pack('<f',random.uniform(1,1.0001)))[0] for _ in range(n)]
    o,e=topk_cluster(sc,n,K,bs); r=ref(sc,n,K)
    assert o==r,(it,n,K,bs,mode)
    assert e==sorted(set(p//bs for p in r))
print("cluster ok")
