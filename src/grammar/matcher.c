/* The grammar matcher: an incremental recognizer for a compiled grammar, and token masks over a trie.
 *
 * Configurations. A parse in progress is a set of stacks, as in llama.cpp's grammar sampler. A stack
 * frame is a position in elems[] (what to match next in that rule's alternative); a stack is a chain
 * of frames. Frames are hash-consed nodes (pos, parent) in an arena, so a stack is one node id and
 * equal stacks are equal ids. A state is the sorted set of the top nodes of every live stack, each
 * top at a byte-set element, plus "accepting" (some stack ran empty: the input so far is a
 * sentence). Closure from a (pos, parent) pair: at GR_END return to the parent frame (or accept at
 * the bottom); at a rule reference push one frame per alternative, with the return position as a
 * new parent node, except when the reference is the last element (a tail call: the parent is reused,
 * so x*, x+ and right recursion keep a constant-size stack); at a byte set stop (a top). Each node is
 * expanded at most once per closure (an epoch mark), which bounds ambiguous grammars; left recursion,
 * which would grow stacks without reading input, is rejected by the parser.
 *
 * The lazy DFA. States are interned too, and each has a row of next-state ids over the grammar's byte
 * classes, filled on first use (-1 = not computed yet; state 0 is the dead state). After warm-up a
 * byte costs one table lookup, whatever the grammar. Masks walk the token trie in preorder with a
 * state per depth: next = row[state][class(byte)], a dead state skips the node's whole subtree, and
 * every token ending at a live node is allowed. A walk visits O(live trie nodes) entries; its result
 * is cached per state (OSP_GRAMMAR_MASK_CACHE masks), so a state met again (inside a string, for
 * instance) costs one copy of the bitset.
 *
 * Threads. A family (a matcher and its clones) shares one automaton behind one mutex, so members may
 * be used and freed from different threads (the engine frees a finished request on the poller's
 * thread while a sibling samples on the loop thread); different families share nothing.
 *
 * Bounds. The arena and tables only grow while a matcher family lives; when they pass AUTO_MAX_NODES
 * nodes or AUTO_MAX_STATES states, the next call rebuilds them from the states the live matchers hold
 * (every other entry is cache). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "grammar/grammar_internal.h"

#define AUTO_MAX_NODES (1 << 21)
/* One step's closure may expand at most this many (pos, parent) pairs: stack sets are not merged by
 * top (no graph-structured stack), so an ambiguous grammar ("x ::= ("(" x*) ." and the like) can hold
 * exponentially many stacks; past the cap the step fails with OSP_ERR_UNSUPPORTED instead of hanging. */
#define STEP_MAX_EXPANSIONS (1 << 16)
#define TOO_AMBIGUOUS (-3)
#define AUTO_MAX_STATES (1 << 16)

/* ---- token trie ------------------------------------------------------------------------------ */

struct osp_token_trie {
    int32_t n_vocab;
    int32_t n_nodes;
    int32_t max_depth;
    uint8_t *byte;      /* [n_nodes]: the byte on the edge into the node (root: 0) */
    int32_t *depth;     /* [n_nodes]: root 0 */
    int32_t *skip;      /* [n_nodes]: first node after this node's subtree */
    int32_t *tok_begin; /* [n_nodes + 1]: tokens ending at node i are toks[tok_begin[i] .. tok_begin[i + 1]) */
    int32_t *toks;      /* [n in trie] */
    uint8_t *is_eog;    /* [n_vocab] */
    int32_t *eog;       /* [n_eog] */
    int32_t n_eog;
    uint8_t *allowed;   /* [n_vocab]: 1 when in the trie (non-empty, not excluded) */
    int64_t *tok_off;   /* [n_vocab + 1]: bytes of token i are tok_bytes[tok_off[i] .. tok_off[i + 1]) */
    uint8_t *tok_bytes;
};

typedef struct trie_sort_ctx {
    const uint8_t *bytes;
    const int64_t *off;
} trie_sort_ctx;

static _Thread_local trie_sort_ctx g_sort; /* qsort has no context argument in C17 */

static int tok_cmp(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const int64_t lx = g_sort.off[x + 1] - g_sort.off[x], ly = g_sort.off[y + 1] - g_sort.off[y];
    const int c = memcmp(g_sort.bytes + g_sort.off[x], g_sort.bytes + g_sort.off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void osp_token_trie_free(osp_token_trie *t) {
    if (!t) return;
    free(t->byte), free(t->depth), free(t->skip), free(t->tok_begin), free(t->toks);
    free(t->is_eog), free(t->eog), free(t->allowed), free(t->tok_off), free(t->tok_bytes);
    free(t);
}

osp_status osp_token_trie_new(int32_t n_vocab, const uint8_t *const *bytes, const size_t *lens, const bool *excluded,
                              const int32_t *eog, int32_t n_eog, osp_token_trie **out) {
    if (n_vocab <= 0 || !bytes || !lens || (n_eog && !eog) || n_eog < 0 || !out)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_token_trie_new: bad arguments");
    osp_token_trie *t = calloc(1, sizeof *t);
    int32_t *order = NULL, *node_of = NULL;
    if (!t) goto oom;
    t->n_vocab = n_vocab;
    t->is_eog = calloc((size_t)n_vocab, 1);
    t->allowed = calloc((size_t)n_vocab, 1);
    t->tok_off = malloc(((size_t)n_vocab + 1) * sizeof *t->tok_off);
    t->eog = malloc(((size_t)n_eog + 1) * sizeof *t->eog);
    if (!t->is_eog || !t->allowed || !t->tok_off || !t->eog) goto oom;
    for (int32_t i = 0; i < n_eog; i++) {
        if (eog[i] < 0 || eog[i] >= n_vocab) {
            osp_token_trie_free(t);
            return osp_set_error(OSP_ERR_INVALID_ARG, "osp_token_trie_new: eog id %d outside the vocabulary", eog[i]);
        }
        if (!t->is_eog[eog[i]]) t->eog[t->n_eog++] = eog[i];
        t->is_eog[eog[i]] = 1;
    }
    int64_t total = 0;
    int32_t n_in = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        t->tok_off[i] = total;
        total += (int64_t)lens[i];
        if (lens[i] && !(excluded && excluded[i]) && !t->is_eog[i]) t->allowed[i] = 1, n_in++;
    }
    t->tok_off[n_vocab] = total;
    t->tok_bytes = malloc((size_t)total + 1);
    order = malloc(((size_t)n_in + 1) * sizeof *order);
    if (!t->tok_bytes || !order) goto oom;
    for (int32_t i = 0, k = 0; i < n_vocab; i++) {
        if (lens[i]) memcpy(t->tok_bytes + t->tok_off[i], bytes[i], lens[i]);
        if (t->allowed[i]) order[k++] = i;
    }
    g_sort = (trie_sort_ctx){t->tok_bytes, t->tok_off};
    if (n_in > 1) qsort(order, (size_t)n_in, sizeof *order, tok_cmp);
    /* nodes in preorder: each token in sorted order shares its longest common prefix with the one
     * before it; the rest of its bytes are new nodes */
    int64_t cap = 1;
    for (int32_t k = 0; k < n_in; k++) cap += t->tok_off[order[k] + 1] - t->tok_off[order[k]];
    if (cap > INT32_MAX / 2) {
        free(order);
        osp_token_trie_free(t);
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_token_trie_new: vocabulary too large");
    }
    t->byte = malloc((size_t)cap);
    t->depth = malloc((size_t)cap * sizeof *t->depth);
    t->skip = malloc((size_t)cap * sizeof *t->skip);
    t->tok_begin = calloc((size_t)cap + 1, sizeof *t->tok_begin);
    t->toks = malloc(((size_t)n_in + 1) * sizeof *t->toks);
    node_of = malloc(((size_t)n_in + 1) * sizeof *node_of);
    int32_t *path = malloc(((size_t)cap + 1) * sizeof *path); /* path[d]: node at depth d on the current path */
    if (!t->byte || !t->depth || !t->skip || !t->tok_begin || !t->toks || !node_of || !path) {
        free(path);
        goto oom;
    }
    int32_t n = 1, plen = 0; /* plen: depth of the current path */
    t->byte[0] = 0, t->depth[0] = 0, path[0] = 0;
    const uint8_t *prev = NULL;
    int64_t prev_len = 0;
    for (int32_t k = 0; k < n_in; k++) {
        const uint8_t *s = t->tok_bytes + t->tok_off[order[k]];
        const int64_t len = t->tok_off[order[k] + 1] - t->tok_off[order[k]];
        int64_t common = 0;
        while (prev && common < len && common < prev_len && s[common] == prev[common]) common++;
        while (plen > common) t->skip[path[plen--]] = n; /* close the subtrees left behind */
        for (int64_t d = common; d < len; d++) {
            t->byte[n] = s[d], t->depth[n] = (int32_t)d + 1;
            path[++plen] = n++;
        }
        if (plen > t->max_depth) t->max_depth = plen;
        node_of[k] = path[plen];
        prev = s, prev_len = len;
    }
    while (plen > 0) t->skip[path[plen--]] = n;
    t->skip[0] = n;
    free(path);
    t->n_nodes = n;
    for (int32_t k = 0; k < n_in; k++) t->tok_begin[node_of[k] + 1]++;
    for (int32_t i = 0; i < n; i++) t->tok_begin[i + 1] += t->tok_begin[i];
    for (int32_t k = 0; k < n_in; k++) t->toks[k] = order[k]; /* sorted order = node order */
    free(order);
    free(node_of);
    *out = t;
    return OSP_OK;
oom:
    free(order);
    free(node_of);
    osp_token_trie_free(t);
    return osp_set_error(OSP_ERR_NOMEM, "osp_token_trie_new: out of memory");
}

osp_status osp_token_trie_from_tokenizer(const osp_tokenizer *tok, osp_token_trie **out) {
    if (!tok || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_token_trie_from_tokenizer: NULL argument");
    const int32_t nv = osp_tokenizer_n_vocab(tok);
    const size_t maxb = osp_tokenizer_max_token_bytes(tok) + 1;
    uint8_t *buf = malloc(maxb * (size_t)nv + 1);
    const uint8_t **bytes = malloc((size_t)nv * sizeof *bytes);
    size_t *lens = malloc((size_t)nv * sizeof *lens);
    bool *excl = malloc((size_t)nv);
    int32_t *eog = malloc((size_t)nv * sizeof *eog);
    int32_t n_eog = 0;
    osp_status st = OSP_OK;
    if (!buf || !bytes || !lens || !excl || !eog) st = osp_set_error(OSP_ERR_NOMEM, "token trie: out of memory");
    const uint32_t not_text = OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_UNKNOWN | OSP_TOKEN_ATTR_UNUSED;
    for (int32_t i = 0; st == OSP_OK && i < nv; i++) {
        bytes[i] = buf + maxb * (size_t)i;
        st = osp_tokenizer_token_bytes(tok, i, (char *)buf + maxb * (size_t)i, maxb, &lens[i]);
        const uint32_t attr = osp_tokenizer_attr(tok, i);
        excl[i] = (attr & not_text) != 0 || attr == OSP_TOKEN_ATTR_UNDEFINED;
        if (osp_tokenizer_is_eog(tok, i)) eog[n_eog++] = i;
    }
    if (st == OSP_OK) st = osp_token_trie_new(nv, bytes, lens, excl, eog, n_eog, out);
    free(buf), free(bytes), free(lens), free(excl), free(eog);
    return st;
}

int32_t osp_token_trie_n_vocab(const osp_token_trie *t) { return t ? t->n_vocab : 0; }
int32_t osp_token_trie_n_nodes(const osp_token_trie *t) { return t ? t->n_nodes : 0; }
bool osp_token_trie_is_eog(const osp_token_trie *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->is_eog[id];
}

/* ---- the automaton (shared by a matcher and its clones) ------------------------------------------ */

typedef struct gnode {
    int32_t pos, parent; /* parent: node id, -1 at the bottom */
} gnode;

typedef struct automaton {
    pthread_mutex_t mu;
    const osp_grammar *g;
    osp_grammar *owned; /* freed with the automaton (osp_grammar_matcher_new_owning), or NULL */
    int32_t nc; /* byte classes: the width of a transition row */

    gnode *nodes;    /* [n_nodes] */
    uint32_t *mark;  /* [n_nodes]: epoch of the closure that last expanded the node */
    int32_t n_nodes, cap_nodes;
    int32_t *node_hash; /* [node_hash_cap] node ids, -1 empty */
    uint32_t node_hash_cap;
    uint32_t epoch;

    int64_t *st_off;     /* [n_states]: tops of state s are tops[st_off[s] .. st_off[s] + st_len[s]) */
    int32_t *st_len;     /* [n_states] */
    uint8_t *st_accept;  /* [n_states] */
    int32_t *st_mask;    /* [n_states]: index of its cached mask or -1 */
    int32_t *trans;      /* [n_states, nc]: next state, -1 not computed */
    int32_t n_states, cap_states;
    int32_t *tops;       /* [n_tops] */
    int64_t n_tops, cap_tops;
    int32_t *st_hash;    /* [st_hash_cap] state ids, -1 empty */
    uint32_t st_hash_cap;

    const osp_token_trie *mask_trie; /* the trie the cached masks were made with */
    uint32_t *masks;                 /* [n_masks, mask_words] */
    int32_t n_masks, mask_words;
    int32_t *walk;                   /* [walk_cap]: state per trie depth */
    int32_t walk_cap;

    int32_t *work;   /* closure stack: (pos, parent) pairs */
    int64_t n_work, cap_work;
    int32_t *scratch; /* tops of the state being built */
    int32_t n_scratch, cap_scratch;

    osp_grammar_matcher **users; /* the matchers sharing this automaton */
    int32_t n_users, cap_users;
} automaton;

struct osp_grammar_matcher {
    automaton *a;
    int32_t state;
    int terminated;
};

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q, *cap = c;
    return 0;
}

static uint32_t hash2(uint32_t a, uint32_t b) {
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

static int rehash_nodes(automaton *a, uint32_t cap) {
    int32_t *h = malloc((size_t)cap * sizeof *h);
    if (!h) return -1;
    memset(h, 0xff, (size_t)cap * sizeof *h);
    for (int32_t i = 0; i < a->n_nodes; i++) {
        uint32_t k = hash2((uint32_t)a->nodes[i].pos, (uint32_t)a->nodes[i].parent) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = i;
    }
    free(a->node_hash);
    a->node_hash = h, a->node_hash_cap = cap;
    return 0;
}

/* The id of node (pos, parent), added if new; -1 on NOMEM. */
static int32_t intern_node(automaton *a, int32_t pos, int32_t parent) {
    if ((uint32_t)a->n_nodes * 2 >= a->node_hash_cap && rehash_nodes(a, a->node_hash_cap ? a->node_hash_cap * 2 : 1024))
        return -1;
    const uint32_t m = a->node_hash_cap - 1;
    uint32_t k = hash2((uint32_t)pos, (uint32_t)parent) & m;
    for (; a->node_hash[k] >= 0; k = (k + 1) & m) {
        const gnode *n = &a->nodes[a->node_hash[k]];
        if (n->pos == pos && n->parent == parent) return a->node_hash[k];
    }
    if (a->n_nodes == a->cap_nodes) {
        const int32_t cap = a->cap_nodes ? a->cap_nodes * 2 : 1024;
        gnode *nn = realloc(a->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return -1;
        a->nodes = nn;
        uint32_t *mk = realloc(a->mark, (size_t)cap * sizeof *mk);
        if (!mk) return -1;
        a->mark = mk, a->cap_nodes = cap;
    }
    a->nodes[a->n_nodes] = (gnode){pos, parent};
    a->mark[a->n_nodes] = 0;
    a->node_hash[k] = a->n_nodes;
    return a->n_nodes++;
}

static uint32_t state_hash(const int32_t *tops, int32_t n, int accept) {
    uint32_t h = 0x811C9DC5u ^ (uint32_t)accept;
    for (int32_t i = 0; i < n; i++) h = hash2(h, (uint32_t)tops[i]);
    return h;
}

static int rehash_states(automaton *a, uint32_t cap) {
    int32_t *h = malloc((size_t)cap * sizeof *h);
    if (!h) return -1;
    memset(h, 0xff, (size_t)cap * sizeof *h);
    for (int32_t s = 0; s < a->n_states; s++) {
        uint32_t k = state_hash(a->tops + a->st_off[s], a->st_len[s], a->st_accept[s]) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = s;
    }
    free(a->st_hash);
    a->st_hash = h, a->st_hash_cap = cap;
    return 0;
}

/* The id of the state with tops[0..n) (sorted, unique) and `accept`, added if new; -1 on NOMEM. */
static int32_t intern_state(automaton *a, const int32_t *tops, int32_t n, int accept) {
    if ((uint32_t)a->n_states * 2 >= a->st_hash_cap && rehash_states(a, a->st_hash_cap ? a->st_hash_cap * 2 : 256))
        return -1;
    const uint32_t m = a->st_hash_cap - 1;
    uint32_t k = state_hash(tops, n, accept) & m;
    for (; a->st_hash[k] >= 0; k = (k + 1) & m) {
        const int32_t s = a->st_hash[k];
        if (a->st_len[s] == n && a->st_accept[s] == accept &&
            (n == 0 || memcmp(a->tops + a->st_off[s], tops, (size_t)n * sizeof *tops) == 0))
            return s;
    }
    if (a->n_states == a->cap_states) {
        const int32_t cap = a->cap_states ? a->cap_states * 2 : 256;
        int64_t *off = realloc(a->st_off, (size_t)cap * sizeof *off);
        if (off) a->st_off = off;
        int32_t *len = realloc(a->st_len, (size_t)cap * sizeof *len);
        if (len) a->st_len = len;
        uint8_t *acc = realloc(a->st_accept, (size_t)cap);
        if (acc) a->st_accept = acc;
        int32_t *msk = realloc(a->st_mask, (size_t)cap * sizeof *msk);
        if (msk) a->st_mask = msk;
        int32_t *tr = realloc(a->trans, (size_t)cap * (size_t)a->nc * sizeof *tr);
        if (tr) a->trans = tr;
        if (!off || !len || !acc || !msk || !tr) return -1;
        a->cap_states = cap;
    }
    /* + 1: the pool exists even while every state is empty (no arithmetic on a NULL pool) */
    if (grow((void **)&a->tops, &a->cap_tops, a->n_tops + n + 1, sizeof *a->tops)) return -1;
    const int32_t s = a->n_states++;
    a->st_off[s] = a->n_tops, a->st_len[s] = n, a->st_accept[s] = (uint8_t)accept, a->st_mask[s] = -1;
    if (n) memcpy(a->tops + a->n_tops, tops, (size_t)n * sizeof *tops);
    a->n_tops += n;
    memset(a->trans + (size_t)s * (size_t)a->nc, 0xff, (size_t)a->nc * sizeof *a->trans);
    a->st_hash[k] = s;
    return s;
}

static int push_work(automaton *a, int32_t pos, int32_t parent) {
    if (grow((void **)&a->work, &a->cap_work, a->n_work + 2, sizeof *a->work)) return -1;
    a->work[a->n_work++] = pos;
    a->work[a->n_work++] = parent;
    return 0;
}

static int cmp_i32(const void *x, const void *y) {
    const int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return a < b ? -1 : a > b;
}

/* Runs the closure of the pairs on the work stack and interns the resulting state. Returns the
 * state id, -1 on NOMEM or TOO_AMBIGUOUS past STEP_MAX_EXPANSIONS. (a->epoch must have been advanced
 * by the caller.) */
static int32_t close_and_intern(automaton *a) {
    const osp_grammar *g = a->g;
    int accept = 0;
    int32_t expansions = 0;
    a->n_scratch = 0;
    while (a->n_work > 0) {
        if (++expansions > STEP_MAX_EXPANSIONS) return TOO_AMBIGUOUS;
        const int32_t parent = a->work[--a->n_work];
        const int32_t pos = a->work[--a->n_work];
        const int32_t id = intern_node(a, pos, parent);
        if (id < 0) return -1;
        if (a->mark[id] == a->epoch) continue;
        a->mark[id] = a->epoch;
        const int32_t e = g->elems[pos];
        if (e >= 0) {
            if (a->n_scratch == a->cap_scratch) {
                int64_t cap = a->cap_scratch;
                if (grow((void **)&a->scratch, &cap, (int64_t)a->n_scratch + 1, sizeof *a->scratch)) return -1;
                a->cap_scratch = (int32_t)cap;
            }
            a->scratch[a->n_scratch++] = id;
        } else if (e == GR_END) {
            if (parent < 0) accept = 1;
            else if (push_work(a, a->nodes[parent].pos, a->nodes[parent].parent)) return -1;
        } else {
            const int32_t r = GR_REF_RULE(e);
            int32_t np = parent;
            if (g->elems[pos + 1] != GR_END && (np = intern_node(a, pos + 1, parent)) < 0) return -1;
            for (int32_t k = g->rule_alt[r + 1] - 1; k >= g->rule_alt[r]; k--)
                if (push_work(a, g->alt_start[k], np)) return -1;
        }
    }
    if (a->n_scratch > 1) qsort(a->scratch, (size_t)a->n_scratch, sizeof *a->scratch, cmp_i32);
    return intern_state(a, a->scratch, a->n_scratch, accept);
}

static void next_epoch(automaton *a) {
    if (++a->epoch == 0) { /* wrapped: clear every mark once */
        memset(a->mark, 0, (size_t)a->n_nodes * sizeof *a->mark);
        a->epoch = 1;
    }
}

/* The state after byte class c from state s (computed and stored on first use); -1 on NOMEM,
 * TOO_AMBIGUOUS. */
static int32_t step(automaton *a, int32_t s, int32_t c) {
    int32_t t = a->trans[(size_t)s * (size_t)a->nc + (size_t)c];
    if (t >= 0) return t;
    const osp_grammar *g = a->g;
    const unsigned b = a->g->class_rep[c];
    next_epoch(a);
    a->n_work = 0;
    const int32_t n = a->st_len[s];
    /* push in reverse so the closure runs tops in order (only matters for determinism) */
    for (int32_t i = n - 1; i >= 0; i--) {
        const gnode nd = a->nodes[a->tops[a->st_off[s] + i]];
        if (gr_set_has(g->sets[g->elems[nd.pos]], b) && push_work(a, nd.pos + 1, nd.parent)) return -1;
    }
    t = close_and_intern(a);
    if (t == TOO_AMBIGUOUS) a->trans[(size_t)s * (size_t)a->nc + (size_t)c] = 0; /* not tried again: dead */
    if (t < 0) return t;
    a->trans[(size_t)s * (size_t)a->nc + (size_t)c] = t;
    return t;
}

static void automaton_clear(automaton *a) {
    free(a->nodes), free(a->mark), free(a->node_hash);
    free(a->st_off), free(a->st_len), free(a->st_accept), free(a->st_mask), free(a->trans), free(a->tops);
    free(a->st_hash);
    free(a->masks);
    a->nodes = NULL, a->mark = NULL, a->node_hash = NULL, a->n_nodes = a->cap_nodes = 0, a->node_hash_cap = 0;
    a->st_off = NULL, a->st_len = NULL, a->st_accept = NULL, a->st_mask = NULL, a->trans = NULL, a->tops = NULL;
    a->st_hash = NULL, a->n_states = a->cap_states = 0, a->n_tops = a->cap_tops = 0, a->st_hash_cap = 0;
    a->masks = NULL, a->n_masks = 0, a->mask_trie = NULL;
    a->epoch = 0;
}

static void automaton_free(automaton *a) {
    if (!a) return;
    automaton_clear(a);
    osp_grammar_free(a->owned);
    free(a->walk), free(a->work), free(a->scratch), free(a->users);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

/* Sets up the dead state (0) and the start state; returns the start state, -1 or TOO_AMBIGUOUS. */
static int32_t automaton_start(automaton *a) {
    if (intern_state(a, NULL, 0, 0) != 0) return -1;
    next_epoch(a);
    a->n_work = 0;
    const osp_grammar *g = a->g;
    for (int32_t k = g->rule_alt[g->root + 1] - 1; k >= g->rule_alt[g->root]; k--)
        if (push_work(a, g->alt_start[k], -1)) return -1;
    return close_and_intern(a);
}

/* Copies node `id` of `old` (and its parents) into a, returning the new id (map[] caches). */
static int32_t copy_chain(automaton *a, const gnode *old, int32_t *map, int32_t id) {
    if (id < 0) return -1;
    if (map[id] >= 0) return map[id];
    /* find the nearest mapped ancestor, then map downward (no recursion: stacks can be deep) */
    int32_t depth = 0;
    for (int32_t x = id; x >= 0 && map[x] < 0; x = old[x].parent) depth++;
    int32_t *path = malloc((size_t)depth * sizeof *path);
    if (!path) return -2;
    int32_t k = 0;
    for (int32_t x = id; x >= 0 && map[x] < 0; x = old[x].parent) path[k++] = x;
    for (int32_t i = depth - 1; i >= 0; i--) {
        const int32_t x = path[i];
        const int32_t p = old[x].parent < 0 ? -1 : map[old[x].parent];
        const int32_t n = intern_node(a, old[x].pos, p);
        if (n < 0) return free(path), -2;
        map[x] = n;
    }
    free(path);
    return map[id];
}

/* Rebuilds the automaton from the states its matchers hold, dropping every other node and state. */
static osp_status automaton_compact(automaton *a) {
    automaton old = *a;
    a->nodes = NULL, a->mark = NULL, a->node_hash = NULL, a->n_nodes = a->cap_nodes = 0, a->node_hash_cap = 0;
    a->st_off = NULL, a->st_len = NULL, a->st_accept = NULL, a->st_mask = NULL, a->trans = NULL, a->tops = NULL;
    a->st_hash = NULL, a->n_states = a->cap_states = 0, a->n_tops = a->cap_tops = 0, a->st_hash_cap = 0;
    a->masks = NULL, a->n_masks = 0, a->mask_trie = NULL, a->epoch = 0;
    int32_t *map = malloc(((size_t)old.n_nodes + 1) * sizeof *map);
    int32_t *tops = NULL;
    int64_t cap = 0;
    osp_status st = OSP_OK;
    if (!map || intern_state(a, NULL, 0, 0) != 0) st = OSP_ERR_NOMEM;
    if (map) memset(map, 0xff, ((size_t)old.n_nodes + 1) * sizeof *map);
    for (int32_t u = 0; st == OSP_OK && u < a->n_users; u++) {
        osp_grammar_matcher *m = a->users[u];
        const int32_t s = m->state, n = old.st_len[s];
        if (grow((void **)&tops, &cap, n + 1, sizeof *tops)) {
            st = OSP_ERR_NOMEM;
            break;
        }
        for (int32_t i = 0; i < n && st == OSP_OK; i++) {
            const int32_t x = copy_chain(a, old.nodes, map, old.tops[old.st_off[s] + i]);
            if (x < 0) st = OSP_ERR_NOMEM;
            tops[i] = x;
        }
        if (st != OSP_OK) break;
        if (n > 1) qsort(tops, (size_t)n, sizeof *tops, cmp_i32);
        const int32_t ns = intern_state(a, tops, n, old.st_accept[s]);
        if (ns < 0) st = OSP_ERR_NOMEM;
        else m->state = ns;
    }
    free(tops);
    free(map);
    if (st != OSP_OK) {
        /* keep the old tables: the matchers' ids still index them */
        automaton fresh = *a;
        automaton_clear(&fresh);
        *a = old;
        return osp_set_error(OSP_ERR_NOMEM, "grammar matcher: out of memory");
    }
    automaton_clear(&old);
    return OSP_OK;
}

static osp_status maybe_compact(automaton *a) {
    if (a->n_nodes <= AUTO_MAX_NODES && a->n_states <= AUTO_MAX_STATES) return OSP_OK;
    return automaton_compact(a);
}

static osp_status step_error(int32_t code) {
    if (code == TOO_AMBIGUOUS)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "grammar: too ambiguous (one byte expands more than %d parse stacks)",
                             STEP_MAX_EXPANSIONS);
    return osp_set_error(OSP_ERR_NOMEM, "grammar matcher: out of memory");
}

static int add_user(automaton *a, osp_grammar_matcher *m) {
    if (a->n_users == a->cap_users) {
        const int32_t cap = a->cap_users ? a->cap_users * 2 : 4;
        osp_grammar_matcher **u = realloc(a->users, (size_t)cap * sizeof *u);
        if (!u) return -1;
        a->users = u, a->cap_users = cap;
    }
    a->users[a->n_users++] = m;
    return 0;
}

/* ---- matcher --------------------------------------------------------------------------------- */

osp_status osp_grammar_matcher_new(const osp_grammar *g, osp_grammar_matcher **out) {
    if (!g || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_new: NULL argument");
    int32_t start = -1;
    automaton *a = calloc(1, sizeof *a);
    osp_grammar_matcher *m = calloc(1, sizeof *m);
    if (!a || !m) goto oom;
    pthread_mutex_init(&a->mu, NULL);
    a->g = g;
    a->nc = g->n_classes;
    m->a = a;
    if ((start = automaton_start(a)) < 0 || add_user(a, m)) goto oom;
    m->state = start;
    *out = m;
    return OSP_OK;
oom:
    automaton_free(a);
    free(m);
    return step_error(start == TOO_AMBIGUOUS ? TOO_AMBIGUOUS : -1);
}

osp_status osp_grammar_matcher_new_owning(osp_grammar *g, osp_grammar_matcher **out) {
    if (!g || !out) {
        osp_grammar_free(g);
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_new_owning: NULL argument");
    }
    const osp_status st = osp_grammar_matcher_new(g, out);
    if (st != OSP_OK) {
        osp_grammar_free(g);
        return st;
    }
    (*out)->a->owned = g;
    return OSP_OK;
}

osp_status osp_grammar_matcher_clone(const osp_grammar_matcher *m, osp_grammar_matcher **out) {
    if (!m || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_clone: NULL argument");
    osp_grammar_matcher *c = malloc(sizeof *c);
    pthread_mutex_lock(&m->a->mu);
    const int bad = !c || add_user(m->a, c);
    if (!bad) *c = *m;
    pthread_mutex_unlock(&m->a->mu);
    if (bad) {
        free(c);
        return osp_set_error(OSP_ERR_NOMEM, "grammar matcher: out of memory");
    }
    *out = c;
    return OSP_OK;
}

void osp_grammar_matcher_free(osp_grammar_matcher *m) {
    if (!m) return;
    automaton *a = m->a;
    pthread_mutex_lock(&a->mu);
    for (int32_t u = 0; u < a->n_users; u++)
        if (a->users[u] == m) {
            a->users[u] = a->users[--a->n_users];
            break;
        }
    const int last = a->n_users == 0;
    pthread_mutex_unlock(&a->mu);
    if (last) automaton_free(a);
    free(m);
}

static osp_status accept_bytes_locked(osp_grammar_matcher *m, const uint8_t *data, size_t n) {
    if (m->terminated) return osp_set_error(OSP_ERR_INVALID_ARG, "grammar: input after the end of generation");
    automaton *a = m->a;
    OSP_TRY(maybe_compact(a));
    int32_t s = m->state;
    for (size_t i = 0; i < n; i++) {
        s = step(a, s, a->g->byte_class[data[i]]);
        if (s < 0) return step_error(s);
        if (s == 0) return osp_set_error(OSP_ERR_INVALID_ARG, "grammar: byte %zu (0x%02x) does not fit the grammar", i, data[i]);
    }
    m->state = s;
    return OSP_OK;
}

osp_status osp_grammar_matcher_accept_bytes(osp_grammar_matcher *m, const uint8_t *data, size_t n) {
    if (!m || (!data && n)) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_accept_bytes: NULL argument");
    pthread_mutex_lock(&m->a->mu);
    const osp_status st = accept_bytes_locked(m, data, n);
    pthread_mutex_unlock(&m->a->mu);
    return st;
}

osp_status osp_grammar_matcher_accept_token(osp_grammar_matcher *m, const osp_token_trie *t, int32_t id) {
    if (!m || !t) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_accept_token: NULL argument");
    if (id < 0 || id >= t->n_vocab) return osp_set_error(OSP_ERR_INVALID_ARG, "grammar: token %d outside the vocabulary", id);
    if (m->terminated) return osp_set_error(OSP_ERR_INVALID_ARG, "grammar: token after the end of generation");
    if (!t->is_eog[id] && !t->allowed[id]) return osp_set_error(OSP_ERR_INVALID_ARG, "grammar: token %d is not text", id);
    pthread_mutex_lock(&m->a->mu);
    osp_status st = OSP_OK;
    if (!t->is_eog[id])
        st = accept_bytes_locked(m, t->tok_bytes + t->tok_off[id], (size_t)(t->tok_off[id + 1] - t->tok_off[id]));
    else if (m->a->st_accept[m->state]) m->terminated = 1;
    else st = osp_set_error(OSP_ERR_INVALID_ARG, "grammar: end of generation before the grammar is complete");
    pthread_mutex_unlock(&m->a->mu);
    return st;
}

bool osp_grammar_matcher_is_complete(const osp_grammar_matcher *m) {
    if (!m) return false;
    pthread_mutex_lock(&m->a->mu);
    const bool r = m->a->st_accept[m->state];
    pthread_mutex_unlock(&m->a->mu);
    return r;
}
bool osp_grammar_matcher_is_terminated(const osp_grammar_matcher *m) { return m && m->terminated; }
bool osp_grammar_matcher_can_continue(const osp_grammar_matcher *m) {
    if (!m || m->terminated) return false;
    pthread_mutex_lock(&m->a->mu);
    const bool r = m->a->st_len[m->state] > 0;
    pthread_mutex_unlock(&m->a->mu);
    return r;
}

void osp_grammar_matcher_stats(const osp_grammar_matcher *m, int32_t *n_nodes, int32_t *n_states, int32_t *n_masks) {
    pthread_mutex_lock(&m->a->mu);
    if (n_nodes) *n_nodes = m->a->n_nodes;
    if (n_states) *n_states = m->a->n_states;
    if (n_masks) *n_masks = m->a->n_masks;
    pthread_mutex_unlock(&m->a->mu);
}

static osp_status check_locked(const automaton *a) {
    const osp_grammar *g = a->g;
    for (int32_t i = 0; i < a->n_nodes; i++) {
        const gnode *n = &a->nodes[i];
        if (n->pos < 0 || n->pos >= g->n_elems || n->parent < -1 || n->parent >= i)
            return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: node %d (pos %d, parent %d) out of order", i, n->pos, n->parent);
    }
    if (a->n_states < 1 || a->st_len[0] != 0 || a->st_accept[0])
        return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: state 0 is not the dead state");
    for (int32_t s = 0; s < a->n_states; s++) {
        const int32_t *t = a->tops + a->st_off[s];
        if (a->st_off[s] < 0 || a->st_off[s] + a->st_len[s] > a->n_tops)
            return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: state %d outside the top pool", s);
        for (int32_t k = 0; k < a->st_len[s]; k++) {
            if (t[k] < 0 || t[k] >= a->n_nodes || (k && t[k] <= t[k - 1]) || g->elems[a->nodes[t[k]].pos] < 0)
                return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: state %d top %d (node %d) invalid", s, k, t[k]);
        }
        for (int32_t c = 0; c < a->nc; c++) {
            const int32_t x = a->trans[(size_t)s * (size_t)a->nc + (size_t)c];
            if (x < -1 || x >= a->n_states || (s == 0 && x > 0))
                return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: transition %d --%d--> %d invalid", s, c, x);
        }
        if (a->st_mask[s] < -1 || a->st_mask[s] >= a->n_masks)
            return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: state %d's mask %d invalid", s, a->st_mask[s]);
    }
    for (int32_t u = 0; u < a->n_users; u++)
        if (a->users[u]->a != a || a->users[u]->state < 0 || a->users[u]->state >= a->n_states)
            return osp_set_error(OSP_ERR_INTERNAL, "grammar automaton: member %d of the family is out of place", u);
    return OSP_OK;
}

osp_status osp_grammar_matcher_check_invariants(const osp_grammar_matcher *m) {
    if (!m) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_check_invariants: NULL");
    pthread_mutex_lock(&m->a->mu);
    const osp_status st = check_locked(m->a);
    pthread_mutex_unlock(&m->a->mu);
    return st;
}

/* ---- masks ----------------------------------------------------------------------------------- */

static osp_status fill_mask_locked(osp_grammar_matcher *m, const osp_token_trie *t, uint32_t *mask) {
    const int32_t words = (t->n_vocab + 31) / 32;
    memset(mask, 0, (size_t)words * sizeof *mask);
    if (m->terminated) return OSP_OK;
    automaton *a = m->a;
    OSP_TRY(maybe_compact(a));
    if (a->mask_trie != t) { /* masks are per trie: drop those of another */
        for (int32_t s = 0; s < a->n_states; s++) a->st_mask[s] = -1;
        a->n_masks = 0, a->mask_trie = t, a->mask_words = words;
        free(a->masks);
        a->masks = NULL;
    }
    const int32_t s0 = m->state;
    if (a->st_mask[s0] >= 0) {
        memcpy(mask, a->masks + (size_t)a->st_mask[s0] * (size_t)words, (size_t)words * sizeof *mask);
        return OSP_OK;
    }
    if (t->max_depth + 1 > a->walk_cap) {
        int32_t *w = realloc(a->walk, ((size_t)t->max_depth + 1) * sizeof *w);
        if (!w) return osp_set_error(OSP_ERR_NOMEM, "grammar matcher: out of memory");
        a->walk = w, a->walk_cap = t->max_depth + 1;
    }
    int32_t *st = a->walk;
    st[0] = s0;
    const uint8_t *bc = a->g->byte_class;
    const int32_t nc = a->nc;
    for (int32_t i = 1; i < t->n_nodes;) {
        const int32_t d = t->depth[i];
        const int32_t from = st[d - 1];
        int32_t next = a->trans[(size_t)from * (size_t)nc + bc[t->byte[i]]];
        if (next < 0 && (next = step(a, from, bc[t->byte[i]])) == -1) return step_error(next);
        if (next <= 0) { /* dead, or too ambiguous to follow (TOO_AMBIGUOUS): not allowed */
            i = t->skip[i];
            continue;
        }
        st[d] = next;
        for (int32_t k = t->tok_begin[i]; k < t->tok_begin[i + 1]; k++) mask[t->toks[k] >> 5] |= 1u << (t->toks[k] & 31);
        i++;
    }
    if (a->st_accept[s0])
        for (int32_t k = 0; k < t->n_eog; k++) mask[t->eog[k] >> 5] |= 1u << (t->eog[k] & 31);
    if (a->n_masks < OSP_GRAMMAR_MASK_CACHE) {
        uint32_t *nm = a->masks;
        if ((a->n_masks & (a->n_masks - 1)) == 0) /* 0, 1, 2, 4, ...: double */
            nm = realloc(a->masks, ((size_t)(a->n_masks ? a->n_masks * 2 : 1)) * (size_t)words * sizeof *nm);
        if (nm) {
            a->masks = nm;
            memcpy(a->masks + (size_t)a->n_masks * (size_t)words, mask, (size_t)words * sizeof *mask);
            a->st_mask[s0] = a->n_masks++;
        }
    }
    return OSP_OK;
}

osp_status osp_grammar_matcher_fill_mask(osp_grammar_matcher *m, const osp_token_trie *t, uint32_t *mask) {
    if (!m || !t || !mask) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_grammar_matcher_fill_mask: NULL argument");
    pthread_mutex_lock(&m->a->mu);
    const osp_status st = fill_mask_locked(m, t, mask);
    pthread_mutex_unlock(&m->a->mu);
    return st;
}

/* Whether byte class c holds only whitespace bytes (space, tab, newline, carriage return). */
static bool class_is_space(const osp_grammar *g, int32_t c) {
    const uint8_t r = g->class_rep[c]; /* most classes end here, without the scan */
    if (r != ' ' && r != '\t' && r != '\n' && r != '\r') return false;
    for (int32_t x = 0; x < 256; x++)
        if (g->byte_class[x] == c && x != ' ' && x != '\t' && x != '\n' && x != '\r') return false;
    return true;
}

/* The drafted bytes from state s into F[0..OSP_GRAMMAR_MAX_FORCED): how many. Under the family's lock.
 * A byte is taken when it is the only one the grammar allows, or when it is a colon inside a run and
 * the only byte besides optional whitespace (the draft then assumes the whitespace left out: JSON's
 * "key": is written that way far more often than "key" :, while the layout after a brace, a comma or
 * the colon is the model's; a wrong guess costs only a rejected draft). */
static int32_t forced_bytes_locked(automaton *a, int32_t s, uint8_t *F) {
    const osp_grammar *g = a->g;
    int32_t nf = 0;
    while (nf < OSP_GRAMMAR_MAX_FORCED && !a->st_accept[s]) {
        int32_t live = -1, next = 0, space = -1, space_next = 0, n_space = 0;
        for (int32_t c = 0; c < a->nc; c++) {
            int32_t t = a->trans[(size_t)s * (size_t)a->nc + (size_t)c];
            if (t < 0 && (t = step(a, s, c)) < 0) return nf; /* NOMEM or too ambiguous: stop here */
            if (t == 0) continue;
            if (class_is_space(g, c)) {
                space = c, space_next = t, n_space++;
                continue;
            }
            if (live >= 0) return nf; /* two classes continue: the model chooses */
            live = c, next = t;
        }
        if (live < 0 && n_space == 1) live = space, next = space_next, n_space = 0; /* whitespace, required */
        if (live < 0) return nf; /* only whitespace continues, of several kinds */
        if (n_space > 0 && !(nf > 0 && g->class_rep[live] == ':')) return nf;
        int32_t count = 0;
        uint8_t b = 0;
        for (int32_t x = 0; x < 256 && count < 2; x++)
            if (g->byte_class[x] == live) b = (uint8_t)x, count++;
        if (count != 1) return nf; /* a class of several bytes: the model chooses among them */
        F[nf++] = b;
        s = next;
    }
    return nf;
}

int32_t osp_grammar_matcher_forced_tokens(osp_grammar_matcher *m, const osp_token_trie *t, int32_t *out, int32_t cap) {
    if (!m || !t || !out || cap <= 0 || m->terminated) return 0;
    automaton *a = m->a;
    uint8_t F[OSP_GRAMMAR_MAX_FORCED];
    pthread_mutex_lock(&a->mu);
    int32_t nf = 0;
    if (maybe_compact(a) == OSP_OK) nf = forced_bytes_locked(a, m->state, F);
    pthread_mutex_unlock(&a->mu);
    /* longest match over the trie (preorder: node i's children are i + 1, then each child's skip,
     * while below skip[i]) */
    int32_t n = 0;
    for (int32_t p = 0; p < nf && n < cap;) {
        int32_t node = 0, best = -1, best_len = 0;
        for (int32_t q = p; q < nf; q++) {
            int32_t j = node + 1;
            while (j < t->skip[node] && t->byte[j] != F[q]) j = t->skip[j];
            if (j >= t->skip[node]) break;
            node = j;
            if (t->tok_begin[node] < t->tok_begin[node + 1]) best = t->toks[t->tok_begin[node]], best_len = q - p + 1;
        }
        if (best < 0) break;
        out[n++] = best;
        p += best_len;
    }
    return n;
}

void osp_grammar_apply_mask(float *logits, int32_t n_vocab, const uint32_t *mask) {
    for (int32_t i = 0; i < n_vocab; i++)
        if (!((mask[i >> 5] >> (i & 31)) & 1)) logits[i] = -__builtin_inff();
}
