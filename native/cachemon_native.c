/* cachemon_native: the isolation index of cachemon's KV-event ledger, compiled.
 *
 * IdMultiset holds ids below 2**62 (the ledger's token content ids are 60-bit hashes), once per copy,
 * in one open-addressing table of 64-bit slots: 0 is empty, 1 a removed entry, anything else id + 2.
 * Ids are hashes, so their low bits pick the first slot; collisions probe the next slots. A copy is a
 * slot of its own (an add never searches), a discard clears the first slot holding the id. The table
 * is rebuilt at twice the live ids (dropping removed entries) when live and removed pass 3/4 of it.
 *
 * Why compiled: in pure Python (src/cachemon/state/kv_index.py, BucketIndex, the fallback) an add and
 * a discard of one id per cached block cost the ledger about 26 % more CPU per event; the budget is
 * 20 % (benchmarks/bench_kv_tenants.py measures both). Nothing else of cachemon is compiled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define EMPTY 0
#define REMOVED 1
#define ID_LIMIT (1ULL << 62)

typedef struct {
    PyObject_HEAD
    uint64_t *slots;
    Py_ssize_t mask;      /* slots - 1 (a power of two minus one) */
    Py_ssize_t used;      /* live ids */
    Py_ssize_t filled;    /* live ids and removed entries */
} IdMultiset;

/* A table of `size` slots (a power of two) holding the live ids of the old one. */
static int
rebuild(IdMultiset *self, Py_ssize_t size)
{
    uint64_t *fresh = PyMem_Calloc((size_t)size, sizeof(uint64_t));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t *old = self->slots;
    Py_ssize_t old_size = old == NULL ? 0 : self->mask + 1;
    Py_ssize_t mask = size - 1;
    for (Py_ssize_t i = 0; i < old_size; i++) {
        uint64_t v = old[i];
        if (v > REMOVED) {
            Py_ssize_t j = (Py_ssize_t)(v & (uint64_t)mask);
            while (fresh[j] != EMPTY)
                j = (j + 1) & mask;
            fresh[j] = v;
        }
    }
    PyMem_Free(old);
    self->slots = fresh;
    self->mask = mask;
    self->filled = self->used;
    return 0;
}

static int
slot_value(PyObject *id, uint64_t *out)
{
    unsigned long long u = PyLong_AsUnsignedLongLong(id);
    if (u == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (u >= ID_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "IdMultiset holds ids below 2**62");
        return -1;
    }
    *out = (uint64_t)u + 2;
    return 0;
}

/* The first slot holding v along its probe chain (-1: none); with `copies`, every copy on it counted. */
static Py_ssize_t
find(IdMultiset *self, uint64_t v, Py_ssize_t *copies)
{
    Py_ssize_t mask = self->mask, first = -1;
    uint64_t *s = self->slots;
    for (Py_ssize_t j = (Py_ssize_t)(v & (uint64_t)mask); s[j] != EMPTY; j = (j + 1) & mask) {
        if (s[j] == v) {
            if (first < 0)
                first = j;
            if (copies == NULL)
                break;
            ++*copies;
        }
    }
    return first;
}

static PyObject *
IdMultiset_add(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (slot_value(id, &v) < 0)
        return NULL;
    if ((self->filled + 1) * 4 > (self->mask + 1) * 3) {
        Py_ssize_t size = 16;
        while (size < (self->used + 1) * 2)
            size <<= 1;
        if (rebuild(self, size) < 0)
            return NULL;
    }
    Py_ssize_t mask = self->mask, j = (Py_ssize_t)(v & (uint64_t)mask);
    uint64_t *s = self->slots;
    while (s[j] > REMOVED)
        j = (j + 1) & mask;
    if (s[j] == EMPTY)
        self->filled++;
    s[j] = v;
    self->used++;
    Py_RETURN_NONE;
}

static PyObject *
IdMultiset_discard(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (slot_value(id, &v) < 0)
        return NULL;
    Py_ssize_t j = find(self, v, NULL);
    if (j < 0)
        Py_RETURN_FALSE;
    self->slots[j] = REMOVED;
    self->used--;
    Py_RETURN_TRUE;
}

static PyObject *
IdMultiset_count(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (slot_value(id, &v) < 0)
        return NULL;
    Py_ssize_t n = 0;
    find(self, v, &n);
    return PyLong_FromSsize_t(n);
}

static PyObject *
IdMultiset_ids(IdMultiset *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i <= self->mask; i++) {
        if (self->slots[i] > REMOVED) {
            PyObject *u = PyLong_FromUnsignedLongLong(self->slots[i] - 2);
            if (u == NULL || PyList_Append(out, u) < 0) {
                Py_XDECREF(u);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(u);
        }
    }
    return out;
}

static int
IdMultiset_contains(IdMultiset *self, PyObject *id)
{
    uint64_t v;
    if (slot_value(id, &v) < 0)
        return -1;
    return find(self, v, NULL) >= 0;
}

static Py_ssize_t
IdMultiset_len(IdMultiset *self)
{
    return self->used;
}

static PyObject *
IdMultiset_sizeof(IdMultiset *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(IdMultiset) + (self->mask + 1) * (Py_ssize_t)sizeof(uint64_t));
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
    self->slots = NULL;
    self->used = 0;
    if (rebuild(self, 16) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
IdMultiset_dealloc(IdMultiset *self)
{
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef IdMultiset_methods[] = {
    {"add", (PyCFunction)IdMultiset_add, METH_O, "add(id): one more copy of id."},
    {"discard", (PyCFunction)IdMultiset_discard, METH_O, "discard(id) -> bool: one copy less; False if none was held."},
    {"count", (PyCFunction)IdMultiset_count, METH_O, "count(id) -> int: the copies held."},
    {"ids", (PyCFunction)IdMultiset_ids, METH_NOARGS, "ids() -> list: every id held, once per copy, in no order."},
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
    .tp_doc = "A multiset of ids below 2**62: add, discard, count, `in`, len, ids().",
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
