/* A main() for running a libFuzzer target without libFuzzer: each argument is a file or a folder of
 * files, and every file is passed once to LLVMFuzzerTestOneInput(). ctest uses it to replay the
 * committed seed corpora in every build (gcc, -Werror, ASan), so a seed that crashes the code under
 * test fails `make test`, not only `make fuzz`. Exits 1 if an argument cannot be read or names an
 * empty folder. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Returns 0 on success. The bytes are copied into an exact-size heap buffer so ASan catches any
 * read past the end. */
static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (nb == NULL) {
                fclose(f);
                free(buf);
                return 1;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    uint8_t *exact = malloc(n ? n : 1);
    if (exact == NULL) {
        free(buf);
        return 1;
    }
    if (n) memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    int failed = 0, ran = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            perror(argv[a]);
            failed++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            failed += run_file(argv[a]);
            ran++;
            continue;
        }
        DIR *d = opendir(argv[a]);
        if (d == NULL) {
            perror(argv[a]);
            failed++;
            continue;
        }
        char **names = NULL;
        size_t n = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            char **nn = realloc(names, (n + 1) * sizeof *names);
            if (nn == NULL) break;
            names = nn;
            size_t len = strlen(argv[a]) + strlen(e->d_name) + 2;
            names[n] = malloc(len);
            if (names[n] == NULL) break;
            snprintf(names[n], len, "%s/%s", argv[a], e->d_name);
            n++;
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp_str);
        if (n == 0) {
            fprintf(stderr, "%s: no files\n", argv[a]);
            failed++;
        }
        for (size_t i = 0; i < n; i++) {
            failed += run_file(names[i]);
            ran++;
            free(names[i]);
        }
        free(names);
    }
    printf("replayed %d input(s), %d error(s)\n", ran, failed);
    return failed ? 1 : 0;
}
