/* core_broker._recordc: the batch encoder of plain records, compiled (optional).

Why C: a put_batch of bare 1 KiB messages spends about 13,100 instructions per message in
the pure-Python loop of core_broker/appender.py (bench/RESULTS.md, "Where a message's
instructions go"), nearly all of it per-record interpreter work: attribute reads, struct
packs, two crc32c calls (their argument parsing costs more than the CRC), the pieces, the id
string and the result tuple. Column-wise Python encoding saved 3%. One call per run of records
removes that work. Plain CPython C API rather than Cython: Cython is not among the project's
build requirements, and the function is one loop over a list with a fixed record layout.

What it does (encode_run): starting at msgs[i], encode the records of a run of *plain*
messages (no tag, keys, ids, message group or extra queues; not a batch record; properties of
str keys and values and a born host allowed: a door's publish) of one topic, queue and protocol,
exactly as appender.py's pure-Python loop does (record.encode_head's layout, which
record.bare_head_packer and record.door_head produce too): the record bytes go to ``pending``
(consecutive records in one bytes piece; a body over COPY_MAX as a piece of its own, never
copied), the consume-queue entries (consume_queue.ENTRY) to ``ents``, the PutResults to ``results``. It stops, without
touching anything for that message, at the first message it does not take: any other shape, a
value the struct packs would refuse, a queue offset at or past ``qlimit`` (its queue file must be
made first), a record that does not fit before ``end``. The Python loop handles that message, so
every durability and error path stays in Python: nothing here writes a file or a queue.

CRC32C (Castagnoli, reflected polynomial 0x82F63B78; RFC 3720 appendix B.4): the SSE4.2 crc32
instruction when the CPU has it (8 bytes per instruction), else the slicing-by-8 table method
(Kounavis and Berry, "A Systematic Approach to Building High Performance Software-based CRC
Generators", Intel, 2005; the same tables as Mark Adler's crc32c.c software path).
tests/test_record_native.py compares both with the crc32c package.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: a __slots__ member */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

#define MAGIC_MESSAGE 0xDAA320A7u
#define FLAG_LINK 0x1
#define FLAG_BATCH 0x2
#define PREFIX_SIZE 12
#define HEADER_SIZE 104 /* record.HEADER_SIZE: prefix 12 + fixed 92 */
#define ENTRY_SIZE 20   /* consume_queue.ENTRY: phys i64, size i32, tag hash i64 */
#define COPY_MAX 4096   /* a body this small is copied after its header: one piece, not two */
#define CHUNK (1 << 20) /* most bytes one piece of consecutive records holds */
#define NOGIL_CRC (1 << 20) /* a body this large is checksummed without the GIL */

/* ---- CRC32C ---------------------------------------------------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static uint64_t load64le(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
    return v;
}

/* The register form (inverted) in and out. */
static uint32_t crc_sw(uint32_t c, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8); n--; }
    while (n >= 8) {
        uint64_t w = load64le(p) ^ c;
        c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
            crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^
            crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n) { c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8); n--; }
    return c;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p, size_t n) {
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) { c64 = _mm_crc32_u8((uint32_t)c64, *p++); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
        p += 8;
        n -= 8;
    }
    while (n) { c64 = _mm_crc32_u8((uint32_t)c64, *p++); n--; }
    return (uint32_t)c64;
}
#endif

static int use_hw = 0;

/* crc32c(data, value) of the crc32c package: ``value`` is a finished CRC to continue. */
static uint32_t crc32c_update(uint32_t value, const void *data, size_t n) {
    uint32_t c = ~value;
#ifdef HAVE_SSE42_PATH
    if (use_hw) return ~crc_hw(c, (const unsigned char *)data, n);
#endif
    return ~crc_sw(c, (const unsigned char *)data, n);
}

/* ---- little-endian stores ------------------------------------------------------------ */

static inline void put16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}
static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

/* ---- module state (set once by setup()) ------------------------------------------------ */

static PyTypeObject *put_result_type = NULL; /* core_broker.model.PutResult (a NamedTuple) */
static PyObject *put_ok = NULL;              /* PutStatus.PUT_OK */
static PyObject *empty_tuple = NULL;

/* The message attributes read, by index into attr_names. */
enum { A_BODY, A_EXTRA, A_FLAGS, A_TOPIC, A_QID, A_PROTO, A_TAG, A_MID, A_KEYS, A_PROPS, A_GROUP, A_HOST,
       A_BORN, A_DELIVERY, A_RECONSUME, N_ATTRS };
static const char *const attr_strs[N_ATTRS] = {
    "body", "extra_dispatch", "flags", "topic", "queue_id", "protocol", "tag", "message_id", "keys",
    "properties", "message_group", "born_host", "born_timestamp_ms", "delivery_time_ms", "reconsume_times"};
static PyObject *attr_names[N_ATTRS];

/* Message has __slots__: when each attribute of a message's type is a plain slot (a member
 * descriptor of T_OBJECT_EX, found by the type's own lookup) and the type's getattr is the generic
 * one, reading the slot at its offset is exactly what getattr does (data descriptors come before
 * an instance dict), at a tenth of the cost (a third of this encoder's instructions went to the
 * 17 getattr calls per message). Resolved once per type and kept while the type's version tag
 * (invalidated by any change to it or its bases) stays the same; any other type: getattr. */
static PyTypeObject *slots_type = NULL;
static unsigned int slots_version = 0;
static Py_ssize_t slots_off[N_ATTRS];

static int slots_of(PyTypeObject *tp) {
    if (tp == slots_type && (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag == slots_version)
        return 1;
    if (tp->tp_getattro != PyObject_GenericGetAttr) return 0;
    Py_ssize_t off[N_ATTRS];
    for (int k = 0; k < N_ATTRS; k++) {
        PyObject *d = _PyType_Lookup(tp, attr_names[k]); /* borrowed; also assigns a version tag */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return 0;
        PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
        if (md->type != T_OBJECT_EX) return 0;
        off[k] = md->offset;
    }
    if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
    Py_INCREF(tp);
    Py_XSETREF(slots_type, tp);
    slots_version = tp->tp_version_tag;
    memcpy(slots_off, off, sizeof off);
    return 1;
}

/* Attribute k of m, a new reference; NULL (no error set) when it is missing. */
static inline PyObject *attr(PyObject *m, int k, int slots) {
    if (slots) {
        PyObject *v = *(PyObject **)((char *)m + slots_off[k]);
        Py_XINCREF(v);
        return v;
    }
    PyObject *v = PyObject_GetAttr(m, attr_names[k]);
    if (v == NULL) PyErr_Clear();
    return v;
}

static PyObject *py_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup(PutResult, PUT_OK): PutResult is a tuple type");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(put_result_type, (PyTypeObject *)args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(put_ok, args[1]);
    Py_RETURN_NONE;
}

/* An exact int as a C long long within [lo, hi]; 0 when the object is not one (no error set). */
static int get_int(PyObject *o, long long lo, long long hi, long long *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* 1 when ``v`` (a new reference, consumed; NULL: missing) is falsy, as a plain message's
 * tag, keys, id, group and extra queues are. */
static int falsy(PyObject *v) {
    if (v == NULL) return 0;
    int t;
    if (v == Py_None || v == Py_False) t = 0;
    else if (PyUnicode_CheckExact(v)) t = PyUnicode_GET_LENGTH(v) != 0;
    else if (PyTuple_CheckExact(v)) t = PyTuple_GET_SIZE(v) != 0;
    else if (PyDict_CheckExact(v)) t = PyDict_GET_SIZE(v) != 0;
    else if ((t = PyObject_IsTrue(v)) < 0) PyErr_Clear();
    Py_DECREF(v);
    return t == 0;
}

/* 1 when ``v`` (a new reference, consumed) is ``want`` or an equal exact str/int. */
static int equals(PyObject *v, PyObject *want) {
    if (v == NULL) return 0;
    int eq = v == want;
    if (!eq && Py_TYPE(v) == Py_TYPE(want) && (PyUnicode_CheckExact(v) || PyLong_CheckExact(v))) {
        eq = PyObject_RichCompareBool(v, want, Py_EQ);
        if (eq < 0) { PyErr_Clear(); eq = 0; }
    }
    Py_DECREF(v);
    return eq;
}

/* ``v`` (a new reference, consumed) an exact int in [lo, hi] into *out: 1, else 0. */
static int int_in(PyObject *v, long long lo, long long hi, long long *out) {
    if (v == NULL) return 0;
    int ok = get_int(v, lo, hi, out);
    Py_DECREF(v);
    return ok;
}

/* The size of record.encode_properties(props) for a dict of str keys and str values (u16 key
 * length, u32 value length, key, value; UTF-8), or -1 when the dict holds anything else or a
 * length the struct would refuse: such a message is left to Python. */
static Py_ssize_t props_size(PyObject *props) {
    Py_ssize_t it = 0, total = 0, kl, vl;
    PyObject *k, *v;
    while (PyDict_Next(props, &it, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) return -1;
        if (PyUnicode_AsUTF8AndSize(k, &kl) == NULL || PyUnicode_AsUTF8AndSize(v, &vl) == NULL) {
            PyErr_Clear(); /* (a lone surrogate: str.encode() raises it in Python) */
            return -1;
        }
        if (kl > 0xffff || vl > 0xffffffffLL) return -1;
        total += 6 + kl + vl;
    }
    return total > 0xffffffffLL ? -1 : total;
}

/* Write the properties sized by props_size (nothing has run since: the dict is unchanged). */
static void props_write(PyObject *props, unsigned char *t) {
    Py_ssize_t it = 0, kl, vl;
    PyObject *k, *v;
    while (PyDict_Next(props, &it, &k, &v)) {
        const char *kd = PyUnicode_AsUTF8AndSize(k, &kl), *vd = PyUnicode_AsUTF8AndSize(v, &vl);
        put16(t, (uint16_t)kl);
        put32(t + 2, (uint32_t)vl);
        memcpy(t + 6, kd, (size_t)kl);
        memcpy(t + 6 + kl, vd, (size_t)vl);
        t += 6 + kl + vl;
    }
}

/* "<prefix><phys as 16 upper-case hex digits>": the id of a server-assigned message. */
static PyObject *make_id(PyObject *prefix, uint64_t phys) {
    static const char hex[] = "0123456789ABCDEF";
    char digits[16];
    for (int k = 15; k >= 0; k--) { digits[k] = hex[phys & 0xf]; phys >>= 4; }
    if (PyUnicode_IS_COMPACT_ASCII(prefix)) {
        Py_ssize_t pl = PyUnicode_GET_LENGTH(prefix);
        PyObject *s = PyUnicode_New(pl + 16, 127);
        if (s == NULL) return NULL;
        char *d = (char *)PyUnicode_1BYTE_DATA(s);
        memcpy(d, PyUnicode_1BYTE_DATA(prefix), (size_t)pl);
        memcpy(d + pl, digits, 16);
        return s;
    }
    PyObject *tail = PyUnicode_FromStringAndSize(digits, 16);
    if (tail == NULL) return NULL;
    PyObject *s = PyUnicode_Concat(prefix, tail);
    Py_DECREF(tail);
    return s;
}

/* The open piece of consecutive records: a bytes object filled up to ``used``. */
typedef struct {
    PyObject *buf;
    Py_ssize_t used, cap;
} Piece;

/* Close the open piece into ``pending`` (shrunk to what it holds). -1 on error. */
static int piece_flush(Piece *pc, PyObject *pending) {
    if (pc->buf == NULL) return 0;
    int rc = 0;
    if (pc->used == 0) {
        Py_CLEAR(pc->buf);
        return 0;
    }
    if (pc->used < pc->cap && _PyBytes_Resize(&pc->buf, pc->used) < 0) rc = -1;
    if (rc == 0) rc = PyList_Append(pending, pc->buf);
    Py_CLEAR(pc->buf);
    return rc;
}

/* Room for ``need`` more bytes in the open piece. A new piece is sized for ``guess`` bytes
 * (the rest of the batch if its records were this one's size), at most ``room`` (the rest of
 * the segment) and CHUNK: a batch of equal records fills it exactly. */
static unsigned char *piece_room(Piece *pc, PyObject *pending, Py_ssize_t need, Py_ssize_t guess,
                                 Py_ssize_t room) {
    if (pc->buf != NULL && pc->used + need > pc->cap && piece_flush(pc, pending) < 0) return NULL;
    if (pc->buf == NULL) {
        Py_ssize_t cap = guess < room ? guess : room;
        if (cap > CHUNK) cap = CHUNK;
        if (cap < need) cap = need;
        pc->buf = PyBytes_FromStringAndSize(NULL, cap);
        if (pc->buf == NULL) return NULL;
        pc->used = 0;
        pc->cap = cap;
    }
    return (unsigned char *)PyBytes_AS_STRING(pc->buf) + pc->used;
}

/* encode_run(msgs, i, topic, qid, proto, tp, lt, lp, qo, qlimit, pos, end, now, max_body,
 *             id_prefix, pending, ents, results) -> (next i, next pos)
 *
 * msgs: a list or tuple; tp: topic + protocol, encoded (lt, lp: their lengths); qo: the queue
 * offset of msgs[i]; qlimit: the first queue offset the queue's open file cannot take; pos: the
 * commitlog offset of msgs[i]'s record; end: where the segment (or a warm-up claim) starts. */
static PyObject *py_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "encode_run takes 18 arguments");
        return NULL;
    }
    if (put_result_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_run: setup() was not called");
        return NULL;
    }
    PyObject *msgs = args[0], *topic = args[2], *qid_o = args[3], *proto = args[4], *tp = args[5];
    PyObject *id_prefix = args[14], *pending = args[15], *ents = args[16], *results = args[17];
    if (!(PyList_Check(msgs) || PyTuple_Check(msgs)) || !PyBytes_Check(tp) || !PyUnicode_Check(id_prefix) ||
        !PyList_Check(pending) || !PyList_Check(ents) || !PyList_Check(results)) {
        PyErr_SetString(PyExc_TypeError, "encode_run: bad argument types");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    long long lt = PyLong_AsLongLong(args[6]), lp = PyLong_AsLongLong(args[7]);
    long long qo = PyLong_AsLongLong(args[8]), qlimit = PyLong_AsLongLong(args[9]);
    long long pos = PyLong_AsLongLong(args[10]), end = PyLong_AsLongLong(args[11]);
    long long now = PyLong_AsLongLong(args[12]), max_body = PyLong_AsLongLong(args[13]);
    if (PyErr_Occurred()) return NULL;
    if (lt + lp != PyBytes_GET_SIZE(tp) || lt < 0 || lp < 0 || lt > 0xffff || lp > 0xffff) {
        PyErr_SetString(PyExc_ValueError, "encode_run: bad topic/protocol lengths");
        return NULL;
    }
    long long qid;
    if (!get_int(qid_o, INT32_MIN, INT32_MAX, &qid)) return Py_BuildValue("(nL)", i, pos); /* the struct refuses it */
    const Py_ssize_t hsz0 = HEADER_SIZE + (Py_ssize_t)(lt + lp); /* a bare record's header */
    const char *tpd = PyBytes_AS_STRING(tp);
    Piece pc = {NULL, 0, 0};

    for (;;) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(msgs); /* (re-read: attribute reads may run code) */
        if (i >= n || qo >= qlimit) break;
        PyObject *m = PySequence_Fast_GET_ITEM(msgs, i);
        Py_INCREF(m);
        long long flags, born = 0, delivery, reconsume;
        int sl = slots_of(Py_TYPE(m));
        PyObject *body = attr(m, A_BODY, sl);
        /* The message's own queue id object, for its result; every attribute is read before the GIL
         * may be released (a big body's CRC): another store's call may then change slots_off. */
        PyObject *qm = attr(m, A_QID, sl);
        Py_XINCREF(qm); /* (one reference for equals() to consume) */
        int ok = body != NULL && PyBytes_CheckExact(body) && PyBytes_GET_SIZE(body) <= max_body &&
                 PyBytes_GET_SIZE(body) <= 0xffffffffLL && falsy(attr(m, A_EXTRA, sl)) &&
                 int_in(attr(m, A_FLAGS, sl), 0, 0xffffffffLL, &flags) && !(flags & FLAG_BATCH) &&
                 equals(attr(m, A_TOPIC, sl), topic) && equals(qm, qid_o) &&
                 equals(attr(m, A_PROTO, sl), proto) && falsy(attr(m, A_TAG, sl)) && falsy(attr(m, A_MID, sl)) &&
                 falsy(attr(m, A_KEYS, sl)) && falsy(attr(m, A_GROUP, sl)) &&
                 int_in(attr(m, A_DELIVERY, sl), INT64_MIN, INT64_MAX, &delivery) &&
                 int_in(attr(m, A_RECONSUME, sl), INT32_MIN, INT32_MAX, &reconsume);
        if (ok) { /* born_timestamp_ms or now */
            PyObject *b = attr(m, A_BORN, sl);
            if (b == NULL) ok = 0;
            else {
                if (b == Py_None) born = now;
                else if (!get_int(b, INT64_MIN, INT64_MAX, &born)) ok = 0;
                else if (born == 0) born = now;
                Py_DECREF(b);
            }
        }
        /* A door's message: a born host and properties (str -> str), encoded as record.py does. */
        PyObject *host = NULL, *props = NULL;
        const char *hd = NULL;
        Py_ssize_t hl = 0, prl = 0;
        if (ok) {
            host = attr(m, A_HOST, sl);
            if (host == NULL || (host != Py_None && !PyUnicode_CheckExact(host))) ok = 0;
            else if (host != Py_None && PyUnicode_GET_LENGTH(host)) {
                if ((hd = PyUnicode_AsUTF8AndSize(host, &hl)) == NULL) { PyErr_Clear(); ok = 0; }
                else if (hl > 0xffff) ok = 0;
            }
        }
        if (ok) {
            props = attr(m, A_PROPS, sl);
            if (props == NULL || (props != Py_None && !PyDict_CheckExact(props))) ok = 0;
            else if (props != Py_None && (prl = props_size(props)) < 0) ok = 0;
        }
        Py_ssize_t bl = ok ? PyBytes_GET_SIZE(body) : 0;
        Py_ssize_t hsz = hsz0 + hl + prl;
        Py_ssize_t size = hsz + bl;
        if (!ok || pos + size > end) {
            Py_XDECREF(qm);
            Py_XDECREF(host);
            Py_XDECREF(props);
            Py_XDECREF(body);
            Py_DECREF(m);
            break;
        }
        /* Taken: from here on only allocation can fail, and that raises. */
        int copy = bl <= COPY_MAX;
        Py_ssize_t need = copy ? size : hsz;
        Py_ssize_t left = n - i;
        unsigned char *h = piece_room(&pc, pending, need, left > CHUNK / need ? CHUNK : left * need,
                                      (Py_ssize_t)(end - pos));
        if (h == NULL) goto fail_msg;
        put32(h, (uint32_t)size);
        put32(h + 4, MAGIC_MESSAGE);
        unsigned char *f = h + PREFIX_SIZE;
        put32(f, (uint32_t)(flags & ~FLAG_LINK));
        put32(f + 4, (uint32_t)(int32_t)qid);
        put64(f + 8, (uint64_t)qo);
        put64(f + 16, (uint64_t)pos);
        put64(f + 24, (uint64_t)born);
        put64(f + 32, (uint64_t)now);
        put64(f + 40, (uint64_t)delivery);
        put64(f + 48, (uint64_t)(int64_t)-1); /* origin_offset: not a link */
        put32(f + 56, 0);                      /* origin_size */
        put32(f + 60, (uint32_t)(int32_t)reconsume);
        put16(f + 64, (uint16_t)lt);
        put16(f + 66, (uint16_t)hl);
        memset(f + 68, 0, 6); /* message id, tag, message group: none */
        put16(f + 74, (uint16_t)lp);
        put32(f + 76, 0); /* keys: none */
        put32(f + 80, (uint32_t)prl);
        put32(f + 84, 0); /* dispatch: none */
        put32(f + 88, (uint32_t)bl);
        {
            unsigned char *t = f + 92;
            memcpy(t, tpd, (size_t)lt);
            t += lt;
            if (hl) memcpy(t, hd, (size_t)hl);
            t += hl;
            memcpy(t, tpd + lt, (size_t)lp);
            if (prl) props_write(props, t + lp);
        }
        Py_CLEAR(host);
        Py_CLEAR(props);
        const char *bd = PyBytes_AS_STRING(body);
        uint32_t crc = crc32c_update(0, f, (size_t)(hsz - PREFIX_SIZE));
        if (bl >= NOGIL_CRC) {
            Py_BEGIN_ALLOW_THREADS
            crc = crc32c_update(crc, bd, (size_t)bl);
            Py_END_ALLOW_THREADS
        } else {
            crc = crc32c_update(crc, bd, (size_t)bl);
        }
        put32(h + 8, crc);
        if (copy) {
            memcpy(h + hsz, bd, (size_t)bl);
            pc.used += size;
        } else {
            pc.used += hsz;
            if (piece_flush(&pc, pending) < 0 || PyList_Append(pending, body) < 0) goto fail_msg;
        }
        Py_CLEAR(body);
        {
            PyObject *e = PyBytes_FromStringAndSize(NULL, ENTRY_SIZE);
            if (e == NULL) goto fail_msg;
            unsigned char *ed = (unsigned char *)PyBytes_AS_STRING(e);
            put64(ed, (uint64_t)pos);
            put32(ed + 8, (uint32_t)size);
            put64(ed + 12, 0); /* tag hash: no tag */
            int rc = PyList_Append(ents, e);
            Py_DECREF(e);
            if (rc < 0) goto fail_msg;
        }
        {
            PyObject *mid = make_id(id_prefix, (uint64_t)pos);
            PyObject *qo_o = PyLong_FromLongLong(qo);
            PyObject *pos_o = PyLong_FromLongLong(pos);
            PyObject *size_o = PyLong_FromSsize_t(size);
            PyObject *r = NULL;
            if (mid && qo_o && pos_o && size_o) r = put_result_type->tp_alloc(put_result_type, 7);
            if (r == NULL) {
                Py_XDECREF(mid); Py_XDECREF(qo_o); Py_XDECREF(pos_o); Py_XDECREF(size_o);
                goto fail_msg;
            }
            Py_INCREF(put_ok);
            PyTuple_SET_ITEM(r, 0, put_ok);
            PyTuple_SET_ITEM(r, 1, mid);
            PyTuple_SET_ITEM(r, 2, qm); /* (its reference moves into the result) */
            qm = NULL;
            PyTuple_SET_ITEM(r, 3, qo_o);
            PyTuple_SET_ITEM(r, 4, pos_o);
            PyTuple_SET_ITEM(r, 5, size_o);
            Py_INCREF(empty_tuple);
            PyTuple_SET_ITEM(r, 6, empty_tuple);
            int rc = PyList_Append(results, r);
            Py_DECREF(r);
            if (rc < 0) goto fail_msg;
        }
        Py_DECREF(m);
        i++;
        qo++;
        pos += size;
        continue;
    fail_msg:
        Py_XDECREF(qm);
        Py_XDECREF(host);
        Py_XDECREF(props);
        Py_XDECREF(body);
        Py_DECREF(m);
        Py_CLEAR(pc.buf);
        return NULL;
    }
    if (piece_flush(&pc, pending) < 0) {
        Py_CLEAR(pc.buf);
        return NULL;
    }
    return Py_BuildValue("(nL)", i, pos);
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &value)) return NULL;
    uint32_t c = crc32c_update(value, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32c_sw(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &value)) return NULL;
    uint32_t c = ~crc_sw(~(uint32_t)value, (const unsigned char *)b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))py_setup, METH_FASTCALL,
     "setup(PutResult, PUT_OK): the result type and status encode_run builds."},
    {"encode_run", (PyCFunction)(void (*)(void))py_encode_run, METH_FASTCALL,
     "Encode a run of plain records of one queue; see the module's source comment."},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0): as the crc32c package's."},
    {"crc32c_sw", py_crc32c_sw, METH_VARARGS, "crc32c by the table method only (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recordc", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__recordc(void) {
    crc_init();
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL) return NULL;
    for (int k = 0; k < N_ATTRS; k++)
        if ((attr_names[k] = PyUnicode_InternFromString(attr_strs[k])) == NULL) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    if (PyModule_AddIntConstant(mod, "HARDWARE_CRC", use_hw) < 0) { Py_DECREF(mod); return NULL; }
    return mod;
}
