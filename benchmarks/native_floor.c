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
 * And the same four points building otelprof's step records natively (the "native step records" variant):
 * the regions' timestamps, the batch size, the loss (item()) and the learning rate kept in one C struct, and
 * at the end of optimizer.step() one record in the recorder's format appended to its queue, so that the
 * real recorder processes it. A prototype of a hot path that leaves the step's assembly to one place; it
 * handles the plain training step only (no evaluation, nested or user steps, callbacks or device timers).
 *
 *   Steps(append, kind, phase, dataloader, forward, backward, optimizer)   the step being built; append is
 *                                 the recorder queue's append, the others the record's constants and names
 *   StepTimer(steps, region, original, loss)   region 1 (forward) or 2 (backward); loss: record item()
 *   StepIterator(steps, iterator)              the data-loader region (0) and the batch size
 *   StepHook(steps, post)                      optimizer step pre-hook (post=False) or post-hook (True)
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

/* ------------------------------------------------------------------ step records */

#define MAX_REGIONS 16

typedef struct {
    PyObject_HEAD
    PyObject *append;   /* the recorder queue's append */
    PyObject *kind;     /* the step record's tag */
    PyObject *phase;
    PyObject *names[4]; /* region names by region number */
    long long number;
    int open;
    long long start;
    int regions;
    int region[MAX_REGIONS];
    long long began[MAX_REGIONS], ended[MAX_REGIONS];
    long long samples;
    PyObject *loss;
    long long optimizer_began;
} Steps;

static PyObject *s_item, *s_param_groups, *s_lr, *s_samples, *s_loss, *s_learning_rate;

static void steps_open(Steps *steps, long long at) {
    if (!steps->open) {
        steps->open = 1;
        steps->start = at;
        steps->regions = 0;
        steps->samples = 0;
        Py_CLEAR(steps->loss);
    }
}

static void steps_region(Steps *steps, int region, long long began, long long ended) {
    if (steps->regions < MAX_REGIONS) {
        steps->region[steps->regions] = region;
        steps->began[steps->regions] = began;
        steps->ended[steps->regions] = ended;
        steps->regions++;
    }
}

/* The record (kind, phase, number, start, end, [(name, start, end, depth, None)], scalars, None), appended. */
static int steps_close(Steps *steps, long long end, PyObject *optimizer) {
    if (!steps->open) return 0;
    steps->open = 0;
    PyObject *annotations = PyList_New(steps->regions);
    PyObject *scalars = PyDict_New();
    if (annotations == NULL || scalars == NULL) goto error;
    for (int i = 0; i < steps->regions; i++) {
        PyObject *region = Py_BuildValue("(OLLiO)", steps->names[steps->region[i]], steps->began[i],
                                         steps->ended[i], 0, Py_None);
        if (region == NULL) goto error;
        PyList_SET_ITEM(annotations, i, region);
    }
    if (steps->samples) {
        PyObject *samples = PyLong_FromLongLong(steps->samples);
        if (samples == NULL || PyDict_SetItem(scalars, s_samples, samples) < 0) { Py_XDECREF(samples); goto error; }
        Py_DECREF(samples);
    }
    if (steps->loss != NULL && PyDict_SetItem(scalars, s_loss, steps->loss) < 0) goto error;
    PyObject *groups = PyObject_GetAttr(optimizer, s_param_groups);
    if (groups != NULL && PyList_Check(groups) && PyList_GET_SIZE(groups) > 0 && PyDict_Check(PyList_GET_ITEM(groups, 0))) {
        PyObject *lr = PyDict_GetItemWithError(PyList_GET_ITEM(groups, 0), s_lr);
        if (lr != NULL && PyDict_SetItem(scalars, s_learning_rate, lr) < 0) { Py_DECREF(groups); goto error; }
    }
    Py_XDECREF(groups);
    PyErr_Clear();
    PyObject *record = Py_BuildValue("(OOLLLNNO)", steps->kind, steps->phase, steps->number++, steps->start, end,
                                     annotations, scalars, Py_None);
    Py_CLEAR(steps->loss);
    if (record == NULL) return -1;
    PyObject *done = PyObject_CallOneArg(steps->append, record);
    Py_DECREF(record);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
error:
    Py_XDECREF(annotations);
    Py_XDECREF(scalars);
    Py_CLEAR(steps->loss);
    return -1;
}

static void steps_dealloc(PyObject *op) {
    Steps *steps = (Steps *)op;
    Py_XDECREF(steps->append);
    Py_XDECREF(steps->kind);
    Py_XDECREF(steps->phase);
    for (int i = 0; i < 4; i++) Py_XDECREF(steps->names[i]);
    Py_XDECREF(steps->loss);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *steps_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *append, *kind, *phase, *names[4];
    if (!PyArg_ParseTuple(args, "OOUUUUU", &append, &kind, &phase, &names[0], &names[1], &names[2], &names[3]))
        return NULL;
    Steps *steps = (Steps *)type->tp_alloc(type, 0);
    if (steps == NULL) return NULL;
    Py_INCREF(append);
    Py_INCREF(kind);
    Py_INCREF(phase);
    steps->append = append;
    steps->kind = kind;
    steps->phase = phase;
    for (int i = 0; i < 4; i++) {
        Py_INCREF(names[i]);
        steps->names[i] = names[i];
    }
    return (PyObject *)steps;
}

static PyObject *steps_get_number(PyObject *op, void *unused) { return PyLong_FromLongLong(((Steps *)op)->number); }

static PyGetSetDef steps_getset[] = {
    {"number", steps_get_number, NULL, "Step records appended so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StepsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.Steps",
    .tp_basicsize = sizeof(Steps),
    .tp_dealloc = steps_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_getset = steps_getset,
    .tp_new = steps_new,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Steps *steps;
    PyObject *wrapped;
    int region;
    int loss;
} StepTimer;

static void step_timer_dealloc(PyObject *op) {
    StepTimer *self = (StepTimer *)op;
    Py_XDECREF(self->steps);
    Py_XDECREF(self->wrapped);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *step_timer_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    StepTimer *self = (StepTimer *)op;
    Steps *steps = self->steps;
    long long began = now_ns();
    steps_open(steps, began);
    if (self->loss && PyVectorcall_NARGS(nargsf) >= 1) {
        PyObject *loss = PyObject_CallMethodNoArgs(args[0], s_item);
        if (loss != NULL)
            Py_XSETREF(steps->loss, loss);
        else
            PyErr_Clear();
        began = now_ns();
    }
    PyObject *result = PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    steps_region(steps, self->region, began, now_ns());
    return result;
}

static PyObject *step_timer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *steps, *wrapped;
    int region, loss;
    if (!PyArg_ParseTuple(args, "O!iOp", &StepsType, &steps, &region, &wrapped, &loss)) return NULL;
    if (region < 0 || region > 3) {
        PyErr_SetString(PyExc_ValueError, "region must be 0..3");
        return NULL;
    }
    StepTimer *self = (StepTimer *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(steps);
    Py_INCREF(wrapped);
    self->steps = (Steps *)steps;
    self->wrapped = wrapped;
    self->region = region;
    self->loss = loss;
    self->vectorcall = step_timer_vectorcall;
    return (PyObject *)self;
}

static PyTypeObject StepTimerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.StepTimer",
    .tp_basicsize = sizeof(StepTimer),
    .tp_dealloc = step_timer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(StepTimer, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = timer_descr_get,
    .tp_new = step_timer_new,
};

typedef struct {
    PyObject_HEAD
    Steps *steps;
    PyObject *iterator;
} StepIterator;

static void step_iterator_dealloc(PyObject *op) {
    StepIterator *self = (StepIterator *)op;
    Py_XDECREF(self->steps);
    Py_XDECREF(self->iterator);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *step_iterator_next(PyObject *op) {
    StepIterator *self = (StepIterator *)op;
    Steps *steps = self->steps;
    long long began = now_ns();
    steps_open(steps, began);
    PyObject *batch = PyIter_Next(self->iterator);
    long long ended = now_ns();
    if (batch == NULL) return NULL;
    steps_region(steps, 0, began, ended);
    /* (inputs, targets) batches: the first element's length is the batch size */
    if ((PyTuple_CheckExact(batch) || PyList_CheckExact(batch)) && PySequence_Size(batch) > 0) {
        PyObject *first = PySequence_GetItem(batch, 0);
        Py_ssize_t size = first != NULL ? PyObject_Size(first) : -1;
        Py_XDECREF(first);
        if (size > 0)
            steps->samples += size;
        else
            PyErr_Clear();
    }
    return batch;
}

static PyObject *step_iterator_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *steps, *iterator;
    if (!PyArg_ParseTuple(args, "O!O", &StepsType, &steps, &iterator)) return NULL;
    if (!PyIter_Check(iterator)) {
        PyErr_SetString(PyExc_TypeError, "StepIterator needs an iterator");
        return NULL;
    }
    StepIterator *self = (StepIterator *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(steps);
    Py_INCREF(iterator);
    self->steps = (Steps *)steps;
    self->iterator = iterator;
    return (PyObject *)self;
}

static PyTypeObject StepIteratorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.StepIterator",
    .tp_basicsize = sizeof(StepIterator),
    .tp_dealloc = step_iterator_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = step_iterator_next,
    .tp_new = step_iterator_new,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Steps *steps;
    int post;
} StepHook;

static void step_hook_dealloc(PyObject *op) {
    Py_XDECREF(((StepHook *)op)->steps);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *step_hook_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    StepHook *self = (StepHook *)op;
    Steps *steps = self->steps;
    long long at = now_ns();
    if (!self->post) {
        steps_open(steps, at);
        steps->optimizer_began = at;
    } else if (steps->open && PyVectorcall_NARGS(nargsf) >= 1) {
        steps_region(steps, 3, steps->optimizer_began, at);
        if (steps_close(steps, at, args[0]) < 0) PyErr_Clear();
    }
    Py_RETURN_NONE;
}

static PyObject *step_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *steps;
    int post;
    if (!PyArg_ParseTuple(args, "O!p", &StepsType, &steps, &post)) return NULL;
    StepHook *self = (StepHook *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(steps);
    self->steps = (Steps *)steps;
    self->post = post;
    self->vectorcall = step_hook_vectorcall;
    return (PyObject *)self;
}

static PyTypeObject StepHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "native_floor.StepHook",
    .tp_basicsize = sizeof(StepHook),
    .tp_dealloc = step_hook_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(StepHook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = step_hook_new,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_floor", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_native_floor(void) {
    PyTypeObject *types[] = {&LogType, &TimerType, &TimedIteratorType, &HookType, &StepsType, &StepTimerType,
                             &StepIteratorType, &StepHookType};
    const char *names[] = {"Log", "Timer", "TimedIterator", "Hook", "Steps", "StepTimer", "StepIterator", "StepHook"};
    s_item = PyUnicode_InternFromString("item");
    s_param_groups = PyUnicode_InternFromString("param_groups");
    s_lr = PyUnicode_InternFromString("lr");
    s_samples = PyUnicode_InternFromString("samples");
    s_loss = PyUnicode_InternFromString("loss");
    s_learning_rate = PyUnicode_InternFromString("learning_rate");
    if (!s_item || !s_param_groups || !s_lr || !s_samples || !s_loss || !s_learning_rate) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    for (int i = 0; i < 8; i++) {
        if (PyType_Ready(types[i]) < 0) return NULL;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) return NULL;
    }
    return m;
}
