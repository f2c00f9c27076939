/* cachemon_native: the isolation index of cachemon's KV-event ledger, compiled.
 *
 * IdMultiset is a multiset of ids: ints 0 <= id < 2**62 (the ledger's token content ids are 60-bit
 * hashes). It holds a count per distinct id, so one call costs the same whether an id has one copy or a
 * million (N tenants sharing one system prompt are N copies of its blocks' ids):
 *
 * - one open-addressing table of distinct ids (64-bit slots: 0 empty, 1 removed, else id + 2), linear
 *   probing from a Fibonacci hash of the id, and beside it a byte per slot: the id's copies, up to 254;
 *   255 says the count is in the `big` dict (ids with 255 copies or more: at most 1/255 of the copies).
 * - growth without a long step: at 3/4 load a table of twice the slots is allocated (calloc, zeroed
 *   pages on demand) and every later add or discard moves MIGRATE_STEP slots of the old table into it,
 *   which ends the move long before the new table fills (see add). Until then an id lives in exactly one
 *   of the two tables. The current table deletes by shifting its cluster back (no removed entries); the
 *   old one, being emptied, marks removed slots instead.
 *
 * Out of the domain: add, discard and count raise TypeError (not an int) or ValueError (an int out of
 * range); `x in index` is False. The pure-Python index (src/cachemon/state/kv_index.py, BucketIndex)
 * answers alike on every input (tests/test_kv_content_index.py checks them against each other).
 *
 * Why compiled: in pure Python the index costs the ledger about twice the CPU per event of this one
 * (benchmarks/bench_kv_tenants.py measures both). Nothing else of cachemon is compiled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define EMPTY 0
#define REMOVED 1
#define ID_LIMIT (1ULL << 62)
#define INLINE_MAX 254          /* copies counted in the slot's byte */
#define BIG 255                 /* the slot's count is in the big dict */
#define MIGRATE_STEP 16         /* old slots moved per add or discard while the table grows */
#define MIN_BITS 4

typedef struct {
    uint64_t *keys;       /* id + 2, EMPTY or REMOVED */
    uint8_t *counts;      /* copies (1..INLINE_MAX) or BIG */
    Py_ssize_t mask;      /* slots - 1 */
    int shift;            /* 64 - log2(slots): the home slot is the top bits of the hashed id */
    Py_ssize_t live;      /* distinct ids held */
} Table;

typedef struct {
    PyObject_HEAD
    Table cur;
    Table old;            /* being moved into cur (keys NULL: not growing) */
    Py_ssize_t moved;     /* old slots below this one are moved */
    Py_ssize_t copies;    /* every copy of every id */
    PyObject *big;        /* id -> copies, for ids of BIG copies or more (NULL until needed) */
} IdMultiset;

static int
table_init(Table *t, int bits)
{
    size_t size = (size_t)1 << bits;
    t->keys = PyMem_Calloc(size, sizeof(uint64_t));
    t->counts = PyMem_Calloc(size, sizeof(uint8_t));
    if (t->keys == NULL || t->counts == NULL) {
        PyMem_Free(t->keys);
        PyMem_Free(t->counts);
        t->keys = NULL;
        t->counts = NULL;
        PyErr_NoMemory();
        return -1;
    }
    t->mask = (Py_ssize_t)size - 1;
    t->shift = 64 - bits;
    t->live = 0;
    return 0;
}

static void
table_free(Table *t)
{
    PyMem_Free(t->keys);
    PyMem_Free(t->counts);
    t->keys = NULL;
    t->counts = NULL;
}

static inline Py_ssize_t
home(const Table *t, uint64_t v)
{
    return (Py_ssize_t)((v * 0x9E3779B97F4A7C15ULL) >> t->shift);
}

/* The slot holding v (-1: none). Removed slots are passed over; an empty one ends the chain. */
static Py_ssize_t
table_find(const Table *t, uint64_t v)
{
    if (t->keys == NULL)
        return -1;
    Py_ssize_t mask = t->mask;
    const uint64_t *k = t->keys;
    for (Py_ssize_t j = home(t, v); k[j] != EMPTY; j = (j + 1) & mask)
        if (k[j] == v)
            return j;
    return -1;
}

/* v, known not held, into the current table (which has no removed slots). */
static void
table_insert(Table *t, uint64_t v, uint8_t count)
{
    Py_ssize_t mask = t->mask, j = home(t, v);
    while (t->keys[j] != EMPTY)
        j = (j + 1) & mask;
    t->keys[j] = v;
    t->counts[j] = count;
    t->live++;
}

/* Slot i of the current table emptied: the entries after it in its cluster that may not stay where
 * they are (their home slot is not in (i, j]) shift back, so no chain is broken. */
static void
table_delete(Table *t, Py_ssize_t i)
{
    Py_ssize_t mask = t->mask, j = i;
    uint64_t *k = t->keys;
    for (;;) {
        j = (j + 1) & mask;
        if (k[j] == EMPTY)
            break;
        Py_ssize_t h = home(t, k[j]);
        int stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            k[i] = k[j];
            t->counts[i] = t->counts[j];
            i = j;
        }
    }
    k[i] = EMPTY;
    t->counts[i] = 0;
    t->live--;
}

/* MIGRATE_STEP more slots of the old table into the current one; the old table freed once empty. */
static void
migrate(IdMultiset *self, Py_ssize_t step)
{
    Table *old = &self->old;
    if (old->keys == NULL)
        return;
    Py_ssize_t end = old->mask + 1;
    if (step < end - self->moved)
        end = self->moved + step;
    for (Py_ssize_t i = self->moved; i < end && old->live > 0; i++) {
        uint64_t v = old->keys[i];
        if (v > REMOVED) {
            table_insert(&self->cur, v, old->counts[i]);
            old->keys[i] = REMOVED;
            old->live--;
        }
    }
    self->moved = end;
    if (old->live == 0)
        table_free(old);
}

static int
id_value(PyObject *id, uint64_t *out)
{
    if (!PyLong_Check(id)) {
        PyErr_Format(PyExc_TypeError, "IdMultiset holds ints, not %.100s", Py_TYPE(id)->tp_name);
        return -1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(id);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        u = ID_LIMIT;
    }
    if (u >= ID_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "IdMultiset holds ids 0 <= id < 2**62");
        return -1;
    }
    *out = (uint64_t)u + 2;
    return 0;
}

/* The table and slot holding v (NULL: not held). */
static Table *
locate(IdMultiset *self, uint64_t v, Py_ssize_t *slot)
{
    *slot = table_find(&self->cur, v);
    if (*slot >= 0)
        return &self->cur;
    *slot = table_find(&self->old, v);
    return *slot >= 0 ? &self->old : NULL;
}

/* The copies of the id in slot `slot` of `t`. */
static PyObject *
copies_of(IdMultiset *self, Table *t, Py_ssize_t slot)
{
    uint8_t c = t->counts[slot];
    if (c != BIG)
        return PyLong_FromLong(c);
    PyObject *key = PyLong_FromUnsignedLongLong(t->keys[slot] - 2);
    if (key == NULL)
        return NULL;
    PyObject *n = PyDict_GetItemWithError(self->big, key);
    Py_DECREF(key);
    if (n == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_SystemError, "IdMultiset lost a count");
    Py_XINCREF(n);
    return n;
}

/* big[id] = n (n >= BIG) or, with n < BIG, the id's count back in its slot's byte. */
static int
set_big(IdMultiset *self, Table *t, Py_ssize_t slot, PyObject *n)
{
    PyObject *key = PyLong_FromUnsignedLongLong(t->keys[slot] - 2);
    if (key == NULL)
        return -1;
    long c = PyLong_AsLong(n);
    int rc;
    if (c == -1 && PyErr_Occurred())
        rc = -1;
    else if (c > INLINE_MAX) {
        rc = PyDict_SetItem(self->big, key, n);
        if (rc == 0)
            t->counts[slot] = BIG;
    }
    else {
        rc = PyDict_DelItem(self->big, key);
        if (rc == 0)
            t->counts[slot] = (uint8_t)c;
    }
    Py_DECREF(key);
    return rc;
}

/* The slot's count plus `delta` (+1 or -1; never to 0: the caller deletes the slot then). */
static int
bump(IdMultiset *self, Table *t, Py_ssize_t slot, int delta)
{
    uint8_t c = t->counts[slot];
    if (c != BIG && c + delta <= INLINE_MAX) {
        t->counts[slot] = (uint8_t)(c + delta);
        return 0;
    }
    if (self->big == NULL && (self->big = PyDict_New()) == NULL)
        return -1;
    PyObject *n = copies_of(self, t, slot);
    if (n == NULL)
        return -1;
    PyObject *d = PyLong_FromLong(delta);
    PyObject *m = d == NULL ? NULL : PyNumber_Add(n, d);
    Py_DECREF(n);
    Py_XDECREF(d);
    if (m == NULL)
        return -1;
    int rc = set_big(self, t, slot, m);
    Py_DECREF(m);
    return rc;
}

static PyObject *
IdMultiset_add(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (id_value(id, &v) < 0)
        return NULL;
    Table *cur = &self->cur;
    if (self->old.keys == NULL) {
        /* not growing: one probe finds the id or the empty slot it goes to */
        Py_ssize_t mask = cur->mask, j = home(cur, v);
        uint64_t *k = cur->keys;
        while (k[j] != EMPTY && k[j] != v)
            j = (j + 1) & mask;
        if (k[j] == v) {
            if (bump(self, cur, j, 1) < 0)
                return NULL;
            self->copies++;
            Py_RETURN_NONE;
        }
        if ((cur->live + 1) * 4 <= (cur->mask + 1) * 3) {
            k[j] = v;
            cur->counts[j] = 1;
            cur->live++;
            self->copies++;
            Py_RETURN_NONE;
        }
    }
    migrate(self, MIGRATE_STEP);
    Py_ssize_t slot;
    Table *t = locate(self, v, &slot);
    if (t != NULL) {
        if (bump(self, t, slot, 1) < 0)
            return NULL;
    }
    else {
        if ((cur->live + 1) * 4 > (cur->mask + 1) * 3) {
            /* Grow: twice the slots. The old table holds at most 3/4 of its S slots; the move takes S /
             * MIGRATE_STEP more adds or discards, while the new table (2S slots) takes 3S/4 more ids to
             * reach 3/4 load: the move always ends first (the full move below is a guard only). */
            migrate(self, PY_SSIZE_T_MAX);
            Table fresh;
            if (table_init(&fresh, 64 - cur->shift + 1) < 0)
                return NULL;
            self->old = *cur;
            self->moved = 0;
            *cur = fresh;
        }
        table_insert(cur, v, 1);
    }
    self->copies++;
    Py_RETURN_NONE;
}

static PyObject *
IdMultiset_discard(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (id_value(id, &v) < 0)
        return NULL;
    migrate(self, MIGRATE_STEP);
    Py_ssize_t slot;
    Table *t = locate(self, v, &slot);
    if (t == NULL)
        Py_RETURN_FALSE;
    if (t->counts[slot] == 1) {
        if (t == &self->cur)
            table_delete(t, slot);
        else {
            t->keys[slot] = REMOVED;
            t->counts[slot] = 0;
            t->live--;
        }
    }
    else if (bump(self, t, slot, -1) < 0)
        return NULL;
    self->copies--;
    Py_RETURN_TRUE;
}

static PyObject *
IdMultiset_count(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (id_value(id, &v) < 0)
        return NULL;
    Py_ssize_t slot;
    Table *t = locate(self, v, &slot);
    return t == NULL ? PyLong_FromLong(0) : copies_of(self, t, slot);
}

static int
append_table(IdMultiset *self, Table *t, PyObject *out)
{
    for (Py_ssize_t i = 0; t->keys != NULL && i <= t->mask; i++) {
        if (t->keys[i] <= REMOVED)
            continue;
        PyObject *n = copies_of(self, t, i);
        if (n == NULL)
            return -1;
        Py_ssize_t c = PyLong_AsSsize_t(n);
        Py_DECREF(n);
        if (c == -1 && PyErr_Occurred())
            return -1;
        PyObject *u = PyLong_FromUnsignedLongLong(t->keys[i] - 2);
        if (u == NULL)
            return -1;
        for (Py_ssize_t r = 0; r < c; r++) {
            if (PyList_Append(out, u) < 0) {
                Py_DECREF(u);
                return -1;
            }
        }
        Py_DECREF(u);
    }
    return 0;
}

static PyObject *
IdMultiset_ids(IdMultiset *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (append_table(self, &self->cur, out) < 0 || append_table(self, &self->old, out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static int
IdMultiset_contains(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (id_value(id, &v) < 0) {
        PyErr_Clear();          /* not an id: not held */
        return 0;
    }
    Py_ssize_t slot;
    return locate(self, v, &slot) != NULL;
}

static Py_ssize_t
IdMultiset_len(IdMultiset *self)
{
    return self->copies;
}

static Py_ssize_t
table_bytes(const Table *t)
{
    return t->keys == NULL ? 0 : (t->mask + 1) * (Py_ssize_t)(sizeof(uint64_t) + sizeof(uint8_t));
}

static PyObject *
IdMultiset_sizeof(IdMultiset *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = (Py_ssize_t)sizeof(IdMultiset) + table_bytes(&self->cur) + table_bytes(&self->old);
    return PyLong_FromSsize_t(n);
}

static PyObject *
IdMultiset_layout(IdMultiset *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(nnnn)", self->cur.mask + 1, self->old.keys == NULL ? (Py_ssize_t)0 : self->old.mask + 1,
                         self->old.keys == NULL ? (Py_ssize_t)0 : self->old.live,
                         self->big == NULL ? (Py_ssize_t)0 : PyDict_GET_SIZE(self->big));
}

static PyObject *
IdMultiset_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "IdMultiset() takes no arguments");
        return NULL;
    }
    IdMultiset *self = (IdMultiset *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* tp_alloc zeroes the object: no old table, no big dict */
    if (table_init(&self->cur, MIN_BITS) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
IdMultiset_dealloc(IdMultiset *self)
{
    table_free(&self->cur);
    table_free(&self->old);
    Py_XDECREF(self->big);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef IdMultiset_methods[] = {
    {"add", (PyCFunction)IdMultiset_add, METH_O, "add(id): one more copy of id."},
    {"discard", (PyCFunction)IdMultiset_discard, METH_O, "discard(id) -> bool: one copy less; False if none was held."},
    {"count", (PyCFunction)IdMultiset_count, METH_O, "count(id) -> int: the copies held."},
    {"ids", (PyCFunction)IdMultiset_ids, METH_NOARGS, "ids() -> list: every id held, once per copy, in no order."},
    {"_layout", (PyCFunction)IdMultiset_layout, METH_NOARGS,
     "_layout() -> (slots, old table's slots (0: not growing), ids still in the old table, ids counted in the big dict)."},
    {"__sizeof__", (PyCFunction)IdMultiset_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}
};

static PySequenceMethods IdMultiset_as_sequence = {
    .sq_length = (lenfunc)IdMultiset_len,
    .sq_contains = (objobjproc)IdMultiset_contains,
};

static PyTypeObject IdMultisetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cachemon_native.IdMultiset",
    .tp_doc = "A multiset of ids 0 <= id < 2**62, a count per id: add, discard, count, `in`, len, ids().",
    .tp_basicsize = sizeof(IdMultiset),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = IdMultiset_new,
    .tp_dealloc = (destructor)IdMultiset_dealloc,
    .tp_methods = IdMultiset_methods,
    .tp_as_sequence = &IdMultiset_as_sequence,
};

static struct PyModuleDef cachemon_native_module = {
    PyModuleDef_HEAD_INIT, "cachemon_native", "The compiled isolation index of cachemon's KV-event ledger.", -1, NULL,
};

PyMODINIT_FUNC
PyInit_cachemon_native(void)
{
    if (PyType_Ready(&IdMultisetType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&cachemon_native_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&IdMultisetType);
    if (PyModule_AddObject(m, "IdMultiset", (PyObject *)&IdMultisetType) < 0) {
        Py_DECREF(&IdMultisetType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
