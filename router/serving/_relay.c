/* The relay's per-read loop in C: the whole plain token chunks at the start of one engine read,
 * framed for the client in one pass. Same result as router/serving/fastrelay.py's relay_read_py
 * (whole_chunks + relay_event per chunk, frames joined, one HTTP chunk around them); the tests
 * compare the two on generated reads. Optional: without a compiler the Python version is used.
 *
 * relay_read(data: bytes, want_ids: bool, chunked: bool, budget: int)
 *   -> (out: bytes, tokens: int, used: int, body_bytes: int, chunks: int)
 *
 * id_list_count(data: bytes, start: int, end: int) -> int
 *   the inside data[start:end) of a prompt_token_ids list: commas + 1 when it holds only digits and
 *   commas, 0 when empty, -1 otherwise (relay.py's id_list_count_py; a long prompt's first chunk is
 *   mostly these ids, so the check runs without a copy)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const char TIDS[] = ",\"token_ids\":["; /* 14 bytes */
static const char ANY_TIDS[] = "\"token_ids\":";  /* 12 bytes */
static const char INDEX[] = "\"index\":";         /* 8 bytes */
static const char ERROR[] = "\"error\"";          /* 7 bytes */
static const char PROMPT[] = "prompt_token";      /* 12 bytes */

/* index of sub in s[start:end), or -1 */
static Py_ssize_t find(const char *s, Py_ssize_t start, Py_ssize_t end, const char *sub, Py_ssize_t n) {
    if (start < 0 || end - start < n) {
        return -1;
    }
    const char *p = memmem(s + start, (size_t)(end - start), sub, (size_t)n);
    return p == NULL ? -1 : (Py_ssize_t)(p - s);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* relay_event on b[0:len): tokens (>= 0) and the cut [*cut_a, *cut_b) to leave out of the frame
 * (empty when the ids are kept), or -1 when the event is not of the plain shape. */
static Py_ssize_t plain_event(const char *b, Py_ssize_t len, int want, Py_ssize_t *cut_a, Py_ssize_t *cut_b) {
    if (len < 10 || memcmp(b, "data: {", 7) != 0 || memcmp(b + len - 3, "}\n\n", 3) != 0) {
        return -1;
    }
    Py_ssize_t i = find(b, 0, len, TIDS, 14);
    if (i == -1 || memchr(b, '\n', (size_t)(len - 2)) != NULL || memchr(b, '\r', (size_t)len) != NULL ||
        find(b, 0, len, ERROR, 7) != -1) {
        return -1;
    }
    Py_ssize_t start = i + 14;
    const char *close = memchr(b + start, ']', (size_t)(len - start));
    if (close == NULL) {
        return -1;
    }
    Py_ssize_t end = close - b;
    if (find(b, end, len, ANY_TIDS, 12) != -1 || find(b, 0, len, PROMPT, 12) != -1) {
        return -1;
    }
    Py_ssize_t first = find(b, 0, len, INDEX, 8);
    if (first == -1 || find(b, first + 8, len, INDEX, 8) != -1) {
        return -1; /* exactly one "index": */
    }
    /* _id_count: digits and commas, at least one digit, or nothing at all */
    Py_ssize_t commas = 0, digits = 0;
    for (Py_ssize_t k = start; k < end; k++) {
        char c = b[k];
        if (c == ',') {
            commas++;
        } else if (c >= '0' && c <= '9') {
            digits++;
        } else {
            return -1;
        }
    }
    Py_ssize_t n;
    if (end == start) {
        n = 0;
    } else if (digits == 0) {
        return -1;
    } else {
        n = commas + 1;
    }
    if (want) {
        *cut_a = *cut_b = len;
    } else {
        *cut_a = i;
        *cut_b = end + 1;
    }
    return n;
}

typedef struct {
    Py_ssize_t at;   /* the event's offset in data */
    Py_ssize_t len;  /* its length */
    Py_ssize_t cut_a, cut_b;
} Frame;

static PyObject *relay_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "relay_read(data, want_ids, chunked, budget)");
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "relay_read: data must be bytes");
        return NULL;
    }
    int want = PyObject_IsTrue(args[1]);
    int chunked = PyObject_IsTrue(args[2]);
    Py_ssize_t budget = PyLong_AsSsize_t(args[3]);
    if (want < 0 || chunked < 0 || (budget == -1 && PyErr_Occurred())) {
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);

    Frame local[32];
    Frame *frames = local;
    Py_ssize_t cap = 32, nframes = 0;
    Py_ssize_t pos = 0, used = 0, total = 0, relayed = 0, tokens = 0, out_len = 0;
    int plain = 1;
    PyObject *result = NULL;
    while (pos < size) { /* whole_chunks: "<hex>\r\n<data>\r\n", non-empty, no extension */
        Py_ssize_t lim = pos + 10 < size ? pos + 10 : size;
        Py_ssize_t i = find(data, pos, lim, "\r\n", 2);
        if (i <= pos) {
            break;
        }
        /* The size is refused once it is larger than what is left of the read after its line
         * (it cannot be a whole chunk then): n stays <= size, so neither n * 16 + v, nor i + n + 4,
         * nor the sum of the sizes can overflow, even where Py_ssize_t is 32 bits wide. */
        Py_ssize_t left = size - i - 4, n = 0;
        int bad = 0;
        for (Py_ssize_t k = pos; k < i; k++) {
            int v = hexval(data[k]);
            if (v < 0 || v > left || n > (left - v) / 16) { /* n * 16 + v > left */
                bad = 1;
                break;
            }
            n = n * 16 + v;
        }
        if (bad || n == 0) {
            break;
        }
        Py_ssize_t nxt = i + n + 4; /* <= size */
        if (data[nxt - 2] != '\r' || data[nxt - 1] != '\n') {
            break;
        }
        total += n;
        if (plain) {
            Frame f;
            f.at = i + 2;
            f.len = n;
            Py_ssize_t t = plain_event(data + f.at, n, want, &f.cut_a, &f.cut_b);
            if (t < 0) {
                plain = 0; /* from here on only counted: the rest is the Python path's */
            } else {
                if (nframes == cap) {
                    Frame *grown = PyMem_Malloc(sizeof(Frame) * (size_t)cap * 2);
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    memcpy(grown, frames, sizeof(Frame) * (size_t)cap);
                    if (frames != local) {
                        PyMem_Free(frames);
                    }
                    frames = grown;
                    cap *= 2;
                }
                frames[nframes++] = f;
                tokens += t;
                relayed += n;
                out_len += n - (f.cut_b - f.cut_a);
                used = nxt;
            }
        }
        pos = nxt;
    }
    if (total > budget || nframes == 0) { /* over the response limit: the Python path fails it */
        result = Py_BuildValue("(yiiii)", "", 0, 0, 0, 0);
        goto done;
    }
    char head[24];
    int head_len = 0;
    if (chunked) {
        head_len = snprintf(head, sizeof(head), "%zx\r\n", (size_t)out_len);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, out_len + head_len + (chunked ? 2 : 0));
    if (out == NULL) {
        goto done;
    }
    char *w = PyBytes_AS_STRING(out);
    memcpy(w, head, (size_t)head_len);
    w += head_len;
    for (Py_ssize_t k = 0; k < nframes; k++) {
        const char *src = data + frames[k].at;
        Frame *f = &frames[k];
        memcpy(w, src, (size_t)f->cut_a);
        w += f->cut_a;
        if (f->cut_b < f->len) {
            memcpy(w, src + f->cut_b, (size_t)(f->len - f->cut_b));
            w += f->len - f->cut_b;
        }
    }
    if (chunked) {
        memcpy(w, "\r\n", 2);
    }
    result = Py_BuildValue("(Nnnnn)", out, tokens, used, relayed, nframes);
done:
    if (frames != local) {
        PyMem_Free(frames);
    }
    return result;
}

static PyObject *id_list_count(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "id_list_count(data: bytes, start: int, end: int)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    if (start < 0 || end > len || start > end) {
        PyErr_SetString(PyExc_ValueError, "id_list_count: start/end outside data");
        return NULL;
    }
    if (start == end) {
        return PyLong_FromSsize_t(0);
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    /* branch-free over blocks of 128 bytes with byte-wide counters (the compiler vectorises the
     * inner loop): a long prompt's ids are tens of kilobytes */
    Py_ssize_t commas = 0;
    unsigned char bad = 0;
    Py_ssize_t k = start;
    for (; k + 128 <= end; k += 128) {
        unsigned char n = 0, odd = 0;
        for (int i = 0; i < 128; i++) {
            unsigned char c = b[k + i];
            unsigned char comma = c == ',';
            n += comma;
            odd |= (unsigned char)((unsigned char)(c - '0') > 9) & (unsigned char)!comma;
        }
        commas += n;
        bad |= odd;
    }
    for (; k < end; k++) {
        unsigned char c = b[k];
        unsigned char comma = c == ',';
        commas += comma;
        bad |= (unsigned char)((unsigned char)(c - '0') > 9) & (unsigned char)!comma;
    }
    return PyLong_FromSsize_t(bad ? -1 : commas + 1);
}

static PyMethodDef methods[] = {
    {"id_list_count", (PyCFunction)(void (*)(void))id_list_count, METH_FASTCALL,
     "id_list_count(data, start, end) -> ids in data[start:end) (digits and commas), else -1"},
    {"relay_read", (PyCFunction)(void (*)(void))relay_read, METH_FASTCALL,
     "relay_read(data, want_ids, chunked, budget) -> (out, tokens, used, body_bytes, chunks)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_relay", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__relay(void) { return PyModule_Create(&module); }
