/* Code point classes, White_Space, lenient UTF-8 decoding and the GPT-2 byte map (see unicode.h).
 * Everything here is a pure function of its inputs; the byte map is computed on the fly (it is a
 * handful of comparisons) so there is no global state to initialise. */
#include "tokenizer/unicode.h"

uint32_t osp_unicode_class(uint32_t cp) {
    if (cp >= 0x110000) return OSP_UCLASS_UNASSIGNED;
    /* binary search for the last range starting at or before cp */
    uint32_t lo = 0, hi = osp_unicode_n_ranges;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (osp_unicode_ranges[mid].first <= cp) lo = mid;
        else hi = mid;
    }
    return osp_unicode_ranges[lo].cls;
}

bool osp_unicode_is_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

size_t osp_utf8_decode_lenient(const char *s, size_t len, uint32_t *cps) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, n = 0;
#define CONT(k) ((u[i + (k)] & 0xC0) == 0x80)
    while (i < len) {
        unsigned c = u[i];
        if (c < 0x80) {
            cps[n++] = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && c >= 0xC0 && i + 1 < len && CONT(1)) {
            cps[n++] = ((c & 0x1Fu) << 6) | (u[i + 1] & 0x3Fu);
            i += 2;
        } else if ((c & 0xF0) == 0xE0 && i + 2 < len && CONT(1) && CONT(2)) {
            cps[n++] = ((c & 0x0Fu) << 12) | ((u[i + 1] & 0x3Fu) << 6) | (u[i + 2] & 0x3Fu);
            i += 3;
        } else if ((c & 0xF8) == 0xF0 && i + 3 < len && CONT(1) && CONT(2) && CONT(3) &&
                   (((c & 0x07u) << 18) | ((u[i + 1] & 0x3Fu) << 12)) < 0x110000) {
            /* llama.cpp decodes F4 90.. and F5..F7 leads to values past U+10FFFF and then throws
             * when re-encoding them; we read such a lead byte as invalid instead */
            cps[n++] = ((c & 0x07u) << 18) | ((u[i + 1] & 0x3Fu) << 12) | ((u[i + 2] & 0x3Fu) << 6) |
                       (u[i + 3] & 0x3Fu);
            i += 4;
        } else {
            cps[n++] = 0xFFFD; /* continuation byte, 0xF8..0xFF, or truncated/broken sequence */
            i += 1;
        }
    }
#undef CONT
    return n;
}

int osp_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp < 0x110000) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

/* printable bytes that map to themselves: '!'..'~', 0xA1..0xAC, 0xAE..0xFF */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t osp_byte_to_unicode(uint8_t b) {
    if (byte_is_printable(b)) return b;
    /* the k-th non-printable byte (in byte order) maps to U+0100 + k */
    unsigned k;
    if (b <= 0x20) k = b;                    /* 0x00..0x20: 33 bytes */
    else if (b == 0x7F) k = 33;
    else if (b <= 0xA0) k = 34 + (b - 0x80); /* 0x80..0xA0: 33 bytes */
    else k = 67;                             /* 0xAD */
    return 0x100 + k;
}

int osp_unicode_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp > 0x143) return -1;
    unsigned k = cp - 0x100;
    if (k <= 32) return (int)k;
    if (k == 33) return 0x7F;
    if (k <= 66) return (int)(0x80 + (k - 34));
    return 0xAD;
}
