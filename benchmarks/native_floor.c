/* Timestamps into a native buffer: the floor of what hooks on a PyTorch training loop can cost.
 *
 * Built and used by native_floor.py (a benchmark, not part of otelprof). Each hook writes (event code,
 * CLOCK_MONOTONIC ns) into one preallocated array and touches no Python object: no step object, no
 * thread-local, no tuple, no int. What a hot path shaped that way would leave on the training thread.
 *
 *   Log()                         the buffer (65,536 events, then it wraps); .count, .take() -> [(code, ns)]
 *   Timer(log, code, original)    a method descriptor: events code and code + 1 around original(self, ...)
 *   TimedIterator(log, code, it)  an iterator: events code and code + 1 around next(it)
 *   Hook(log, code)               a callable taking anything: event code (optimizer step hooks)
 *
 * The same four points building otelprof's step records in C, once prototyped here, are what
 * otelprof/integrations/_torch_native.c does; native_floor.py measures that against these.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <time.h>

#define CAPACITY 65536

typedef struct {
    PyObject_HEAD
    unsigned long long count;
    long long ns[CAPACITY];
    unsigned char code[CAPACITY];
} Log;

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void log_event(Log *log, int code) {
    size_t at = (size_t)(log->count++ % CAPACITY);
    log->ns[at] = now_ns();
    log->code[at] = (unsigned char)code;
}

static PyObject *log_take(PyObject *op, PyObject *unused) {
    Log *log = (Log *)op;
    unsigned long long n = log->count < CAPACITY ? log->count : CAPACITY;
    unsigned long long first = log->count - n;
    PyObject *events = PyList_New((Py_ssize_t)n);
    if (events == NULL) return NULL;
    for (unsigned long long i = 0; i < n; i++) {
        size_t at = (size_t)((first + i) % CAPACITY);
        PyObject *event = Py_BuildValue("(iL)", (int)log->code[at], log->ns[at]);
        if (event == NULL) { Py_DECREF(events); return NULL; }
        PyList_SET_ITEM(events, (Py_ssize_t)i, event);
    }
    log->count = 0;
    return events;
}

static PyObject *log_get_count(PyObject *op, void *unused) {
    return PyLong_FromUnsignedLongLong(((Log *)op)->count);
}

static PyMethodDef log_methods[] = {
    {"take", log_take, METH_NOARGS, "The events logged since the last take(), oldest first; empties the log."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef log_getset[] = {
    {"count", log_get_count, NULL, "Events logged since the last take().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.Log",
    .tp_basicsize = sizeof(Log),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = log_methods,
    .tp_getset = log_getset,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Log *log;
    PyObject *wrapped;
    int code;
} Timer;

static void timer_dealloc(PyObject *op) {
    Timer *self = (Timer *)op;
    Py_XDECREF(self->log);
    Py_XDECREF(self->wrapped);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *timer_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Timer *self = (Timer *)op;
    log_event(self->log, self->code);
    PyObject *result = PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    log_event(self->log, self->code + 1);
    return result;
}

static PyObject *timer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *log, *wrapped;
    int code;
    if (!PyArg_ParseTuple(args, "O!iO", &LogType, &log, &code, &wrapped)) return NULL;
    Timer *self = (Timer *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(log);
    Py_INCREF(wrapped);
    self->log = (Log *)log;
    self->wrapped = wrapped;
    self->code = code;
    self->vectorcall = timer_vectorcall;
    return (PyObject *)self;
}

static PyObject *timer_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.Timer",
    .tp_basicsize = sizeof(Timer),
    .tp_dealloc = timer_dealloc,
    /* A method descriptor: obj.method() calls it with obj first, without a bound-method object. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Timer, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = timer_descr_get,
    .tp_new = timer_new,
};

typedef struct {
    PyObject_HEAD
    Log *log;
    PyObject *iterator;
    int code;
} TimedIterator;

static void timed_iterator_dealloc(PyObject *op) {
    TimedIterator *self = (TimedIterator *)op;
    Py_XDECREF(self->log);
    Py_XDECREF(self->iterator);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *timed_iterator_next(PyObject *op) {
    TimedIterator *self = (TimedIterator *)op;
    log_event(self->log, self->code);
    PyObject *item = PyIter_Next(self->iterator);
    log_event(self->log, self->code + 1);
    return item;
}

static PyObject *timed_iterator_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *log, *iterator;
    int code;
    if (!PyArg_ParseTuple(args, "O!iO", &LogType, &log, &code, &iterator)) return NULL;
    if (!PyIter_Check(iterator)) {
        PyErr_SetString(PyExc_TypeError, "TimedIterator needs an iterator");
        return NULL;
    }
    TimedIterator *self = (TimedIterator *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(log);
    Py_INCREF(iterator);
    self->log = (Log *)log;
    self->iterator = iterator;
    self->code = code;
    return (PyObject *)self;
}

static PyTypeObject TimedIteratorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.TimedIterator",
    .tp_basicsize = sizeof(TimedIterator),
    .tp_dealloc = timed_iterator_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = timed_iterator_next,
    .tp_new = timed_iterator_new,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Log *log;
    int code;
} Hook;

static void hook_dealloc(PyObject *op) {
    Py_XDECREF(((Hook *)op)->log);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *hook_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Hook *self = (Hook *)op;
    log_event(self->log, self->code);
    Py_RETURN_NONE;
}

static PyObject *hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *log;
    int code;
    if (!PyArg_ParseTuple(args, "O!i", &LogType, &log, &code)) return NULL;
    Hook *self = (Hook *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(log);
    self->log = (Log *)log;
    self->code = code;
    self->vectorcall = hook_vectorcall;
    return (PyObject *)self;
}

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_dealloc = hook_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = hook_new,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_floor", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_native_floor(void) {
    PyTypeObject *types[] = {&LogType, &TimerType, &TimedIteratorType, &HookType};
    const char *names[] = {"Log", "Timer", "TimedIterator", "Hook"};
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    for (int i = 0; i < 4; i++) {
        if (PyType_Ready(types[i]) < 0) return NULL;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) return NULL;
    }
    return m;
}
