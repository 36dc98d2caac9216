/* The PyTorch integration's hot path in C: automatic steps kept in a C struct.
 *
 * otelprof.integrations.torch hooks four points of a training loop: the data-loader iterator, the model's
 * forward (a method of the instrumented subclass), Tensor.backward and the optimizer's step hooks. In
 * Python each hook reads a thread-local, updates a step object and appends a tuple per region; on the
 * training thread, where their code is cold in the CPU caches, that costs about 2 % of a small CNN's step.
 * Here the usual automatic step (opened by the first event of an iteration, ended by optimizer.step())
 * lives in one C struct: timestamps, region depths, batch size, loss and learning rate. At its end it moves
 * to a ring of closed steps and a marker, (hotpath.NATIVE_STEP, steps), goes into the recorder's queue
 * where StepContext.__exit__ would put its record; the recorder calls pop() for each marker and gets that
 * record, built on its own thread. The training thread makes no Python object for a step.
 *
 * Anything else goes to the Python hooks (the "fallback" each C hook holds): a step the user marked, an
 * evaluation forward, an event on a thread other than the step's, profiler windows or step-boundary callbacks
 * about to run, a session
 * not running. Before the Python code runs, a step open here is handed over ("materialised"): the
 * instrumentation's _materialise() takes its state (take()) and makes it a hotpath.StepContext, so that
 * the Python path finds it where it would have put it. hotpath's user calls (record, annotate, step)
 * do the same through hotpath._native. Any unexpected error here turns the C path off for good
 * (on_error is told; the Python hooks carry on); the training loop never sees it.
 *
 *   Steps(hot, names, scalars, materialise, on_error, helpers)   one instrumentation's automatic steps;
 *                                           take() / adopt() hand the open step over, pop() gives records
 *   Forward(steps, original, fallback)      a method descriptor: the instrumented subclass's forward
 *   Backward(steps, original, fallback)     a method descriptor: Tensor.backward (steps may be None); both Timers
 *   Iterator(steps, iterator, fallback)     a data-loader iterator; fallback is the Python proxy
 *   OptimizerHook(steps, fallback, post)    an optimizer step pre-hook (post=False) or post-hook (True)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <time.h>

#define MAX_REGIONS 64 /* regions kept here in one step; past that the step is handed over to Python */
#define MAX_NAMES 4
#define RING_STEPS 256 /* closed steps waiting for the recorder at first (its queue holds a marker for each); the
                          rings double when full, up to the recorder queue's capacity */
#define REGIONS_PER_STEP 8 /* the region ring's size per closed step, at first */

enum { FETCH = 0, FORWARD = 1, BACKWARD = 2, OPTIMIZER = 3 }; /* event kinds = region name indexes */
enum { SAMPLES = 0, LOSS = 1, LEARNING_RATE = 2 };            /* scalar name indexes */

static PyObject *s_step, *s_training, *s_numel, *s_is_cpu, *s_item, *s_detach, *s_shape, *s_param_groups,
    *s_lr, *s_queue, *s_capacity, *s_queue_dropped, *s_append, *s_active, *s_initialized, *s_max_regions;

/* perf_counter_ns() on Linux: CLOCK_MONOTONIC, so times mix with those taken in Python. */
static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    int name;
    int depth;
    long long start, end;
} Region;

/* A closed step waiting for the recorder: its regions are the next `regions` ones of the region ring. */
/* A step's loss: the sum of the losses its backward() calls were given, as the Python hooks add them up (a
 * hotpath.Sum the recorder adds up): on CPU numbers added here, elsewhere tensors kept for the recorder. */
typedef struct {
    double sum;       /* of `count` numbers (CPU losses, item()) */
    long long count;
    PyObject *tensors; /* owned, may be NULL: a hotpath.Sum of detached losses on other devices */
} Loss;

typedef struct {
    PyObject *phase, *lr; /* owned; lr may be NULL */
    Loss loss;
    long long number, start, end, samples;
    int regions;
} Closed;

typedef struct {
    PyObject_HEAD
    /* settings, written by the instrumentation (TorchInstrumentation.sync_native) */
    int enabled;
    int loss;
    int count_samples;
    /* the open step */
    int open;
    unsigned long thread;
    unsigned long long generation; /* bumped whenever the open step ends here or is handed over: a region opened
                                      in an earlier generation ends in Python (steps_end_region) */
    PyObject *phase;
    long long number, start;
    int leader, saw_backward, saw_work, depth;
    unsigned long long fetcher; /* the serial of the iterator whose fetch opened the step (0: not a fetch) */
    int regions, limit; /* limit: hotpath.MAX_STEP_ANNOTATIONS as the step opened, at most MAX_REGIONS */
    Region region[MAX_REGIONS];
    long long samples;
    Loss loss_value;
    PyObject *lr_value;
    int optimizer_nesting, optimizer_depth;
    int closure_evaluated; /* a backward() ran inside the current optimizer.step(closure): its loss is the step's */
    long long optimizer_start;
    /* the last handed-over step, for regions that were open when it was handed over */
    PyObject *adopted;
    unsigned long long adopted_generation;
    /* hotpath's state, mutated in place there */
    PyObject *hot_globals, *tls, *phase_list, *step_numbers, *step_begin, *step_boundary, *native_slot;
    PyObject *step_tag;
    PyObject *names[MAX_NAMES];
    PyObject *scalar_names[3];
    /* Python callables */
    PyObject *materialise, *on_error, *end_region, *add_into, *run_step_boundary, *batch_size, *learning_rate,
        *cuda_memory, *cuda_globals, *tensor_type, *sum_type, *scaled, *grad_enabled;
    /* the recorder whose queue, its append and its capacity are cached */
    PyObject *recorder, *queue, *queue_append;
    Py_ssize_t capacity;
    /* closed steps, in order, until the recorder pops them (FIFO rings) */
    PyObject *marker; /* (hotpath.NATIVE_STEP, self): what the recorder's queue gets for each */
    Closed *closed;
    int closed_head, closed_count, closed_size;
    Region *ring;
    int ring_head, ring_count, ring_size;
} Steps;

static PyTypeObject StepsType;

/* ------------------------------------------------------------------ failures and hand-over */

static void set_native_slot(Steps *self, PyObject *value) {
    Py_INCREF(value);
    PyList_SetItem(self->native_slot, 0, value); /* steals; a list of one item, made by hotpath */
}

/* The open step is no longer here (closed, dropped or handed over): regions still open end in Python. */
static void loss_clear(Loss *loss) {
    loss->sum = 0.0;
    loss->count = 0;
    Py_CLEAR(loss->tensors);
}

static void steps_leave(Steps *self) {
    self->open = 0;
    self->generation++;
    set_native_slot(self, Py_None);
    loss_clear(&self->loss_value);
    Py_CLEAR(self->lr_value);
}

/* An unexpected error in this file's own work: the C path goes off for good, the step open here is dropped,
 * on_error(exc) warns and counts; the Python error indicator is left clear. */
static void steps_fail(Steps *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    self->enabled = 0;
    steps_leave(self);
    if (self->on_error != NULL && value != NULL) {
        PyObject *done = PyObject_CallOneArg(self->on_error, value);
        Py_XDECREF(done);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

/* Hand the open step over to Python (the instrumentation's _materialise calls take() and adopt()). */
static int steps_materialise(Steps *self) {
    if (!self->open) return 0;
    PyObject *done = PyObject_CallNoArgs(self->materialise);
    if (done == NULL) return -1;
    Py_DECREF(done);
    if (self->open) { /* _materialise did not take it: never leave a step open that Python cannot see */
        PyErr_SetString(PyExc_RuntimeError, "the open step was not handed over");
        return -1;
    }
    return 0;
}

/* Before a Python hook runs: the step open here on this thread goes to Python (an error turns the C path off). */
static void steps_hand_over(Steps *self) {
    if (self->open && PyThread_get_thread_ident() == self->thread && steps_materialise(self) < 0) steps_fail(self);
}

/* ------------------------------------------------------------------ opening and closing steps */

static int read_step_numbers(Steps *self, PyObject *phase, long long *number) {
    PyObject *current = PyDict_GetItemWithError(self->step_numbers, phase);
    if (current == NULL) {
        if (PyErr_Occurred()) return -1;
        *number = 0;
        return 0;
    }
    *number = PyLong_AsLongLong(current);
    return (*number == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int write_step_numbers(Steps *self, PyObject *phase, long long number) {
    PyObject *value = PyLong_FromLongLong(number);
    if (value == NULL) return -1;
    int failed = PyDict_SetItem(self->step_numbers, phase, value);
    Py_DECREF(value);
    return failed;
}

/* 1: a step is open here for this event (opened now if none was); 0: the event goes to Python (a step open
 * here was handed over first); -1: error. */
static int steps_ready(Steps *self, int kind) {
    unsigned long thread = PyThread_get_thread_ident();
    if (!self->enabled) return 0;
    if (self->open) {
        if (thread == self->thread) return 1;
        return 0; /* another thread: its own (Python) state; the step here stays with its thread */
    }
    PyObject *recorder = PyDict_GetItemWithError(self->hot_globals, s_active);
    if (recorder == NULL || recorder == Py_None) return PyErr_Occurred() ? -1 : 0;
    if (PyList_GET_SIZE(self->step_begin) > 0) return 0; /* a profiler window opens: Python runs its callbacks */
    PyObject *current = PyObject_GetAttr(self->tls, s_step);
    if (current == NULL) return -1;
    Py_DECREF(current);
    if (current != Py_None) return 0; /* a step marked by the user, or one already handed over */
    PyObject *phase = PyList_GetItem(self->phase_list, 0);
    if (phase == NULL) return -1;
    PyObject *max_regions = PyDict_GetItemWithError(self->hot_globals, s_max_regions);
    if (max_regions == NULL) return PyErr_Occurred() ? -1 : 0;
    long limit = PyLong_AsLong(max_regions);
    if (limit == -1 && PyErr_Occurred()) return -1;
    long long number;
    if (read_step_numbers(self, phase, &number) < 0 || write_step_numbers(self, phase, number + 1) < 0) return -1;
    Py_INCREF(phase);
    Py_XSETREF(self->phase, phase);
    self->number = number;
    self->thread = thread;
    self->leader = kind;
    self->saw_backward = self->saw_work = 0;
    self->fetcher = 0;
    self->depth = 0;
    self->regions = 0;
    self->limit = limit < MAX_REGIONS ? (int)limit : MAX_REGIONS;
    self->samples = 0;
    self->optimizer_nesting = 0;
    loss_clear(&self->loss_value);
    Py_CLEAR(self->lr_value);
    self->open = 1;
    set_native_slot(self, self->materialise);
    self->start = now_ns();
    return 1;
}

/* steps_ready, an error turning the C path off: whether this event is handled here. */
static int steps_enter(Steps *self, int kind) {
    int ready = steps_ready(self, kind);
    if (ready < 0) steps_fail(self);
    return ready > 0;
}

/* (name, start_ns, end_ns, depth, None): a region as the Python hooks append it to StepContext.annotations. */
static PyObject *region_tuple(Steps *self, const Region *r) {
    PyObject *item = PyTuple_New(5);
    if (item == NULL) return NULL;
    PyObject *start = PyLong_FromLongLong(r->start), *end = PyLong_FromLongLong(r->end);
    PyObject *depth = PyLong_FromLong(r->depth);
    if (start == NULL || end == NULL || depth == NULL) {
        Py_XDECREF(start);
        Py_XDECREF(end);
        Py_XDECREF(depth);
        Py_DECREF(item);
        return NULL;
    }
    PyTuple_SET_ITEM(item, 0, Py_NewRef(self->names[r->name]));
    PyTuple_SET_ITEM(item, 1, start);
    PyTuple_SET_ITEM(item, 2, end);
    PyTuple_SET_ITEM(item, 3, depth);
    PyTuple_SET_ITEM(item, 4, Py_NewRef(Py_None));
    return item;
}

/* The list of `count` regions from `regions[first]` on, in a ring of `size` (MAX_REGIONS: the open step's). */
static PyObject *build_annotations(Steps *self, const Region *regions, int first, int count, int size) {
    PyObject *annotations = PyList_New(count);
    if (annotations == NULL) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *item = region_tuple(self, &regions[(first + i) % size]);
        if (item == NULL) {
            Py_DECREF(annotations);
            return NULL;
        }
        PyList_SET_ITEM(annotations, i, item);
    }
    return annotations;
}

/* The loss as a scalar value: a hotpath.Sum of its parts while the step is open (`final` 0: the Python hooks
 * add to it), a number for a closed step of numbers; NULL with no error when there is none. */
static PyObject *build_loss(Steps *self, const Loss *loss, int final) {
    if (loss->count == 0 && loss->tensors == NULL) return NULL;
    if (final && loss->tensors == NULL) return PyFloat_FromDouble(loss->sum);
    PyObject *parts = PyObject_CallNoArgs(self->sum_type);
    if (parts == NULL) return NULL;
    if (loss->count > 0) {
        PyObject *sum = PyFloat_FromDouble(loss->sum);
        int failed = sum == NULL || PyList_Append(parts, sum) < 0;
        Py_XDECREF(sum);
        if (failed) goto error;
    }
    for (Py_ssize_t i = 0; loss->tensors != NULL && i < PyList_GET_SIZE(loss->tensors); i++)
        if (PyList_Append(parts, PyList_GET_ITEM(loss->tensors, i)) < 0) goto error;
    return parts;
error:
    Py_DECREF(parts);
    return NULL;
}

/* A step's scalars as the Python hooks would have put them: None, or {samples, loss, learning_rate}. */
static PyObject *build_scalars(Steps *self, long long samples_value, const Loss *loss_value, PyObject *lr,
                               int final) {
    PyObject *loss = build_loss(self, loss_value, final);
    if (loss == NULL && PyErr_Occurred()) return NULL;
    if (!samples_value && loss == NULL && lr == NULL) Py_RETURN_NONE;
    PyObject *scalars = PyDict_New();
    if (scalars == NULL) {
        Py_XDECREF(loss);
        return NULL;
    }
    if (samples_value) {
        PyObject *samples = PyLong_FromLongLong(samples_value);
        if (samples == NULL) goto error;
        int failed = PyDict_SetItem(scalars, self->scalar_names[SAMPLES], samples);
        Py_DECREF(samples);
        if (failed) goto error;
    }
    if (loss != NULL && PyDict_SetItem(scalars, self->scalar_names[LOSS], loss) < 0) goto error;
    if (lr != NULL && PyDict_SetItem(scalars, self->scalar_names[LEARNING_RATE], lr) < 0) goto error;
    Py_XDECREF(loss);
    return scalars;
error:
    Py_XDECREF(loss);
    Py_DECREF(scalars);
    return NULL;
}

/* (STEP, phase, number, start_ns, end_ns, annotations, scalars, None): the record StepContext.__exit__ makes.
 * Steals annotations and scalars. */
static PyObject *step_record(Steps *self, PyObject *phase, long long number, long long start, long long end,
                             PyObject *annotations, PyObject *scalars) {
    PyObject *record = PyTuple_New(8);
    PyObject *numbers[3] = {PyLong_FromLongLong(number), PyLong_FromLongLong(start), PyLong_FromLongLong(end)};
    if (record == NULL || numbers[0] == NULL || numbers[1] == NULL || numbers[2] == NULL) {
        Py_XDECREF(record);
        for (int i = 0; i < 3; i++) Py_XDECREF(numbers[i]);
        Py_DECREF(annotations);
        Py_DECREF(scalars);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, Py_NewRef(self->step_tag));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(phase));
    PyTuple_SET_ITEM(record, 2, numbers[0]);
    PyTuple_SET_ITEM(record, 3, numbers[1]);
    PyTuple_SET_ITEM(record, 4, numbers[2]);
    PyTuple_SET_ITEM(record, 5, annotations);
    PyTuple_SET_ITEM(record, 6, scalars);
    PyTuple_SET_ITEM(record, 7, Py_NewRef(Py_None));
    return record;
}

/* recorder.queue_dropped += 1, as Recorder.submit counts a record it has no room for. */
static int count_dropped(PyObject *recorder) {
    PyObject *dropped = PyObject_GetAttr(recorder, s_queue_dropped);
    if (dropped == NULL) return -1;
    PyObject *one = PyLong_FromLong(1);
    PyObject *more = one != NULL ? PyNumber_Add(dropped, one) : NULL;
    Py_XDECREF(one);
    Py_DECREF(dropped);
    if (more == NULL) return -1;
    int failed = PyObject_SetAttr(recorder, s_queue_dropped, more);
    Py_DECREF(more);
    return failed;
}

static void closed_clear(Closed *c) {
    Py_CLEAR(c->phase);
    loss_clear(&c->loss);
    Py_CLEAR(c->lr);
}

/* A ring of `*size` items of `item` bytes holding `count` from `*head` on, doubled, in order from index 0. */
static int ring_double(void **ring, size_t item, int *head, int count, int *size) {
    char *doubled = PyMem_Calloc((size_t)*size * 2, item), *old = *ring;
    if (doubled == NULL) return 0;
    for (int i = 0; i < count; i++) memcpy(doubled + (size_t)i * item, old + (size_t)((*head + i) % *size) * item, item);
    PyMem_Free(old);
    *ring = doubled;
    *head = 0;
    *size *= 2;
    return 1;
}

/* Room in the rings for one more closed step of `regions` regions, doubling them when full: the closed-step
 * ring up to `limit` (the recorder queue's capacity). 0: no room. */
static int rings_room(Steps *self, int regions, Py_ssize_t limit) {
    if (self->closed_count == self->closed_size
        && (self->closed_size >= limit || self->closed_size > (1 << 24)
            || !ring_double((void **)&self->closed, sizeof(Closed), &self->closed_head, self->closed_count,
                            &self->closed_size)))
        return 0;
    while (self->ring_count + regions > self->ring_size)
        if (self->ring_size > (1 << 26)
            || !ring_double((void **)&self->ring, sizeof(Region), &self->ring_head, self->ring_count, &self->ring_size))
            return 0;
    return 1;
}

/* The closed step into the ring and its marker into the recorder's queue; the recorder builds the record
 * (pop()) on its own thread. No room in the queue or the rings: dropped and counted. */
static int submit(Steps *self, long long end) {
    PyObject *recorder = PyDict_GetItemWithError(self->hot_globals, s_active);
    if (recorder == NULL) return PyErr_Occurred() ? -1 : 0;
    if (recorder == Py_None) return 0;
    if (recorder != self->recorder) { /* a new session: cache its queue and capacity */
        PyObject *queue = PyObject_GetAttr(recorder, s_queue);
        if (queue == NULL) return -1;
        PyObject *append = PyObject_GetAttr(queue, s_append);
        PyObject *capacity = PyObject_GetAttr(recorder, s_capacity);
        Py_ssize_t limit = capacity != NULL ? PyLong_AsSsize_t(capacity) : -1;
        Py_XDECREF(capacity);
        if (append == NULL || (limit == -1 && PyErr_Occurred())) {
            Py_DECREF(queue);
            Py_XDECREF(append);
            return -1;
        }
        Py_INCREF(recorder);
        Py_XSETREF(self->recorder, recorder);
        Py_XSETREF(self->queue, queue);
        Py_XSETREF(self->queue_append, append);
        self->capacity = limit;
    }
    Py_ssize_t length = PyObject_Size(self->queue);
    if (length < 0) return -1;
    if (length >= self->capacity || !rings_room(self, self->regions, self->capacity)) return count_dropped(recorder);
    Closed *c = &self->closed[(self->closed_head + self->closed_count) % self->closed_size];
    c->phase = Py_NewRef(self->phase);
    c->loss = self->loss_value; /* moved: the step's tensors now belong to the closed step */
    self->loss_value.tensors = NULL;
    loss_clear(&self->loss_value);
    c->lr = self->lr_value;
    self->lr_value = NULL;
    c->number = self->number;
    c->start = self->start;
    c->end = end;
    c->samples = self->samples;
    c->regions = self->regions;
    for (int i = 0; i < self->regions; i++)
        self->ring[(self->ring_head + self->ring_count + i) % self->ring_size] = self->region[i];
    self->closed_count++;
    self->ring_count += self->regions;
    PyObject *done = PyObject_CallOneArg(self->queue_append, self->marker);
    if (done == NULL) { /* not queued: take the step back out, so that the markers and the ring stay in step */
        self->closed_count--;
        self->ring_count -= self->regions;
        closed_clear(c);
        return -1;
    }
    Py_DECREF(done);
    return 0;
}

/* StepContext.__exit__ for the step open here (its record queued as above), then the step-boundary
 * callbacks when there are any (they may raise StopTraining on purpose: -2). */
static int steps_close(Steps *self, long long end) {
    int failed = submit(self, end);
    steps_leave(self);
    if (failed) return -1;
    if (PyList_GET_SIZE(self->step_boundary) > 0) {
        PyObject *done = PyObject_CallNoArgs(self->run_step_boundary);
        if (done == NULL) return -2;
        Py_DECREF(done);
    }
    return 0;
}

/* An epoch's last fetch opened a step and nothing else came: drop it (_AutoSteps.cancel). */
static int steps_cancel(Steps *self) {
    steps_leave(self);
    long long number;
    if (read_step_numbers(self, self->phase, &number) < 0) return -1;
    if (number == self->number + 1) return write_step_numbers(self, self->phase, self->number);
    return 0;
}

/* The Python step a region or batch of `generation` belongs to: the step handed over in that generation, or
 * None (the region or batch stands on its own). Borrowed. */
static PyObject *step_of(Steps *self, unsigned long long generation) {
    return self->adopted != NULL && self->adopted_generation == generation ? self->adopted : Py_None;
}

/* A region opened in `generation` ends: into the step open here, or (handed over since, or to be handed over
 * now that the step holds as many regions as it can here) through hotpath._end_region into the Python step,
 * or on its own. Keeps a pending exception. */
static void steps_end_region(Steps *self, int name, long long start, long long end, int depth,
                             unsigned long long generation) {
    if (self->open && self->generation == generation && self->regions < self->limit) {
        self->depth = depth;
        Region *r = &self->region[self->regions++];
        r->name = name;
        r->depth = depth;
        r->start = start;
        r->end = end;
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (self->open && self->generation == generation && steps_materialise(self) < 0) {
        steps_fail(self);
    } else {
        PyObject *step = step_of(self, generation);
        PyObject *starts = PyLong_FromLongLong(start), *depths = PyLong_FromLong(depth);
        PyObject *done = (starts && depths) ? PyObject_CallFunctionObjArgs(self->end_region, self->names[name],
                                                                           starts, step, depths, NULL) : NULL;
        Py_XDECREF(starts);
        Py_XDECREF(depths);
        if (done == NULL)
            steps_fail(self);
        else
            Py_DECREF(done);
    }
    PyErr_Restore(type, value, tb);
}

static int steps_begin_region(Steps *self) { return self->depth++; }

/* ------------------------------------------------------------------ Steps: Python interface */

static PyObject *steps_take(PyObject *op, PyObject *unused) {
    Steps *self = (Steps *)op;
    if (!self->open || PyThread_get_thread_ident() != self->thread) Py_RETURN_NONE;
    PyObject *annotations = build_annotations(self, self->region, 0, self->regions, MAX_REGIONS);
    if (annotations == NULL) return NULL;
    PyObject *scalars = build_scalars(self, self->samples, &self->loss_value, self->lr_value, 0);
    if (scalars == NULL) {
        Py_DECREF(annotations);
        return NULL;
    }
    PyObject *optimizer = self->optimizer_nesting > 0
        ? Py_BuildValue("(Liii)", self->optimizer_start, self->optimizer_depth, self->optimizer_nesting,
                        self->closure_evaluated)
        : Py_NewRef(Py_None);
    if (optimizer == NULL) {
        Py_DECREF(annotations);
        Py_DECREF(scalars);
        return NULL;
    }
    PyObject *state = Py_BuildValue("(OLLNNiiiiN)", self->phase, self->number, self->start, annotations, scalars,
                                    self->depth, self->leader, self->saw_backward, self->saw_work, optimizer);
    if (state == NULL) return NULL;
    self->adopted_generation = self->generation;
    Py_CLEAR(self->adopted);
    steps_leave(self);
    return state;
}

static PyObject *steps_pop(PyObject *op, PyObject *unused) {
    Steps *self = (Steps *)op;
    if (self->closed_count == 0) Py_RETURN_NONE;
    Closed *c = &self->closed[self->closed_head];
    PyObject *annotations = build_annotations(self, self->ring, self->ring_head, c->regions, self->ring_size);
    PyObject *scalars = annotations != NULL ? build_scalars(self, c->samples, &c->loss, c->lr, 1) : NULL;
    PyObject *record = NULL;
    if (scalars != NULL)
        record = step_record(self, c->phase, c->number, c->start, c->end, annotations, scalars);
    else
        Py_XDECREF(annotations);
    /* popped even when building failed: the next marker is the next step's */
    self->closed_head = (self->closed_head + 1) % self->closed_size;
    self->closed_count--;
    self->ring_head = (self->ring_head + c->regions) % self->ring_size;
    self->ring_count -= c->regions;
    closed_clear(c);
    return record;
}

static PyObject *steps_adopt(PyObject *op, PyObject *step) {
    Steps *self = (Steps *)op;
    Py_INCREF(step);
    Py_XSETREF(self->adopted, step);
    Py_RETURN_NONE;
}

static PyObject *steps_release(PyObject *op, PyObject *unused) {
    Steps *self = (Steps *)op;
    self->enabled = 0;
    steps_leave(self);
    Py_CLEAR(self->adopted);
    Py_CLEAR(self->materialise);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->queue_append);
    Py_RETURN_NONE;
}

static int steps_traverse(PyObject *op, visitproc visit, void *arg) {
    Steps *self = (Steps *)op;
    Py_VISIT(self->materialise);
    Py_VISIT(self->on_error);
    Py_VISIT(self->adopted);
    Py_VISIT(self->loss_value.tensors);
    Py_VISIT(self->lr_value);
    Py_VISIT(self->marker);
    return 0;
}

static int steps_clear(PyObject *op) {
    Steps *self = (Steps *)op;
    Py_CLEAR(self->materialise);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->adopted);
    loss_clear(&self->loss_value);
    Py_CLEAR(self->lr_value);
    Py_CLEAR(self->marker);
    return 0;
}

static void steps_dealloc(PyObject *op) {
    Steps *self = (Steps *)op;
    PyObject_GC_UnTrack(op);
    steps_clear(op);
    PyObject **refs[] = {&self->phase, &self->hot_globals, &self->tls, &self->phase_list, &self->step_numbers,
                         &self->step_begin, &self->step_boundary, &self->native_slot, &self->step_tag,
                         &self->end_region, &self->add_into, &self->run_step_boundary, &self->batch_size,
                         &self->learning_rate, &self->cuda_memory, &self->cuda_globals, &self->tensor_type,
                         &self->sum_type, &self->scaled, &self->grad_enabled,
                         &self->recorder, &self->queue, &self->queue_append};
    for (size_t i = 0; i < sizeof(refs) / sizeof(refs[0]); i++) Py_CLEAR(*refs[i]);
    for (int i = 0; i < MAX_NAMES; i++) Py_CLEAR(self->names[i]);
    for (int i = 0; i < 3; i++) Py_CLEAR(self->scalar_names[i]);
    if (self->closed != NULL) {
        for (int i = 0; i < self->closed_count; i++)
            closed_clear(&self->closed[(self->closed_head + i) % self->closed_size]);
        PyMem_Free(self->closed);
    }
    PyMem_Free(self->ring);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *get_item(PyObject *mapping, const char *key) {
    PyObject *value = PyMapping_GetItemString(mapping, key);
    if (value == NULL && !PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s", key);
    return value;
}

/* Steps(hot_globals, names, scalar_names, materialise, on_error, helpers): hot_globals is vars(hotpath);
 * names the four region names (fetch, forward, backward, optimizer order); scalar_names (samples, loss,
 * learning_rate); helpers a dict of batch_size, learning_rate, cuda_memory, cuda_globals, tensor_type, sum_type
 * (hotpath.Sum), scaled (the list of one item where GradScaler.scale notes the loss it scaled) and grad_enabled
 * (torch.is_grad_enabled). */
static PyObject *steps_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *hot, *names, *scalar_names, *materialise, *on_error, *helpers;
    if (!PyArg_ParseTuple(args, "O!O!O!OOO!", &PyDict_Type, &hot, &PyTuple_Type, &names, &PyTuple_Type,
                          &scalar_names, &materialise, &on_error, &PyDict_Type, &helpers))
        return NULL;
    if (PyTuple_GET_SIZE(names) != MAX_NAMES || PyTuple_GET_SIZE(scalar_names) != 3) {
        PyErr_SetString(PyExc_ValueError, "four region names and three scalar names");
        return NULL;
    }
    Steps *self = (Steps *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(hot);
    self->hot_globals = hot;
    self->materialise = Py_NewRef(materialise);
    self->on_error = Py_NewRef(on_error);
    for (int i = 0; i < MAX_NAMES; i++) self->names[i] = Py_NewRef(PyTuple_GET_ITEM(names, i));
    for (int i = 0; i < 3; i++) self->scalar_names[i] = Py_NewRef(PyTuple_GET_ITEM(scalar_names, i));
    if (!(self->tls = get_item(hot, "_tls")) || !(self->phase_list = get_item(hot, "_phase"))
        || !(self->step_numbers = get_item(hot, "_step_numbers")) || !(self->step_begin = get_item(hot, "_step_begin"))
        || !(self->step_boundary = get_item(hot, "_step_boundary")) || !(self->native_slot = get_item(hot, "_native"))
        || !(self->step_tag = get_item(hot, "STEP")) || !(self->end_region = get_item(hot, "_end_region"))
        || !(self->add_into = get_item(hot, "_add_into"))
        || !(self->run_step_boundary = get_item(hot, "run_step_boundary"))
        || !(self->batch_size = get_item(helpers, "batch_size"))
        || !(self->learning_rate = get_item(helpers, "learning_rate"))
        || !(self->cuda_memory = get_item(helpers, "cuda_memory"))
        || !(self->cuda_globals = get_item(helpers, "cuda_globals"))
        || !(self->tensor_type = get_item(helpers, "tensor_type"))
        || !(self->sum_type = get_item(helpers, "sum_type")) || !(self->scaled = get_item(helpers, "scaled"))
        || !(self->grad_enabled = get_item(helpers, "grad_enabled")))
        goto error;
    PyObject *marker_tag = get_item(hot, "NATIVE_STEP");
    if (marker_tag == NULL) goto error;
    self->marker = PyTuple_Pack(2, marker_tag, (PyObject *)self);
    Py_DECREF(marker_tag);
    self->closed = PyMem_Calloc(RING_STEPS, sizeof(Closed));
    self->ring = PyMem_Calloc(RING_STEPS * REGIONS_PER_STEP, sizeof(Region));
    self->closed_size = RING_STEPS;
    self->ring_size = RING_STEPS * REGIONS_PER_STEP;
    if (self->marker == NULL || self->closed == NULL || self->ring == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto error;
    }
    if (!PyList_Check(self->phase_list) || PyList_GET_SIZE(self->phase_list) != 1 || !PyList_Check(self->native_slot)
        || PyList_GET_SIZE(self->native_slot) != 1 || !PyList_Check(self->step_begin)
        || !PyList_Check(self->step_boundary) || !PyDict_Check(self->step_numbers) || !PyDict_Check(self->cuda_globals)
        || !PyList_Check(self->scaled) || PyList_GET_SIZE(self->scaled) != 1 || !PyType_Check(self->sum_type)
        || !PyType_IsSubtype((PyTypeObject *)self->sum_type, &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "hotpath's state has an unexpected shape");
        goto error;
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static PyMethodDef steps_methods[] = {
    {"take", steps_take, METH_NOARGS,
     "Hand the step open on this thread over: (phase, number, start_ns, annotations, scalars, depth, leader, "
     "saw_backward, saw_work, optimizer) with optimizer (start_ns, depth, nesting, closure_evaluated) or None; None "
     "when none is open."},
    {"pop", steps_pop, METH_NOARGS,
     "The oldest closed step's record (STEP, phase, number, start_ns, end_ns, annotations, scalars, None), or None; "
     "the recorder calls it for each (NATIVE_STEP, steps) marker in its queue."},
    {"adopt", steps_adopt, METH_O, "The StepContext the taken step became: regions open at the hand-over end there."},
    {"release", steps_release, METH_NOARGS, "Turn off for good and drop the references to Python callables."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef steps_members[] = {
    {"enabled", T_BOOL, offsetof(Steps, enabled), 0, "Events are handled here (else by the Python hooks)."},
    {"loss", T_BOOL, offsetof(Steps, loss), 0, "Record the loss at backward()."},
    {"count_samples", T_BOOL, offsetof(Steps, count_samples), 0, "Record the batch size at each fetch."},
    {"open", T_BOOL, offsetof(Steps, open), READONLY, "A step is open here."},
    {"number", T_LONGLONG, offsetof(Steps, number), READONLY, "The open (or last) step's number."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otelprof.integrations._torch_native.Steps",
    .tp_basicsize = sizeof(Steps),
    .tp_dealloc = steps_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = steps_traverse,
    .tp_clear = steps_clear,
    .tp_methods = steps_methods,
    .tp_members = steps_members,
    .tp_new = steps_new,
    .tp_doc = "One instrumentation's automatic steps, kept in C.",
};

/* ------------------------------------------------------------------ wrappers around a Python callable */

/* Every C hook: the Steps it feeds, what it wraps, and the Python hook it defers to. Timer (Forward, Backward):
 * original is the method it times; OptimizerHook: none; Iterator: original is the data loader's iterator and
 * fallback the Python proxy around it. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Steps *steps; /* may be NULL (Backward with no instrumentation) */
    PyObject *original;
    PyObject *fallback;
    int variant; /* Timer: its region (FORWARD, BACKWARD); OptimizerHook: 1 for the post-hook */
    unsigned long long serial; /* this hook's number, never reused (Iterator: which iterator a fetch came from) */
} Hook;

static unsigned long long hook_serial = 0;

static int hook_traverse(PyObject *op, visitproc visit, void *arg) {
    Hook *self = (Hook *)op;
    Py_VISIT(self->steps);
    Py_VISIT(self->original);
    Py_VISIT(self->fallback);
    return 0;
}

static int hook_clear(PyObject *op) {
    Hook *self = (Hook *)op;
    Py_CLEAR(self->steps);
    Py_CLEAR(self->original);
    Py_CLEAR(self->fallback);
    return 0;
}

static void hook_dealloc(PyObject *op) {
    PyObject_GC_UnTrack(op);
    hook_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *hook_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* Attributes the hook lacks are the original's: __name__ and the like for a method, the iterator's own. */
static PyObject *hook_getattro(PyObject *op, PyObject *name) {
    PyObject *found = PyObject_GenericGetAttr(op, name);
    Hook *self = (Hook *)op;
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError) || self->original == NULL) return found;
    PyErr_Clear();
    return PyObject_GetAttr(self->original, name);
}

static PyObject *hook_get_wrapped(PyObject *op, void *unused) {
    Hook *self = (Hook *)op;
    return Py_NewRef(self->original != NULL ? self->original : Py_None);
}

static PyObject *hook_get_doc(PyObject *op, void *unused) {
    Hook *self = (Hook *)op;
    if (self->original == NULL) Py_RETURN_NONE;
    return PyObject_GetAttrString(self->original, "__doc__");
}

/* A Steps, or NULL for None (a new reference); -1 and TypeError for anything else. */
static int steps_or_none(PyObject *value, Steps **steps) {
    if (value == NULL || value == Py_None) {
        *steps = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(value, &StepsType)) {
        PyErr_SetString(PyExc_TypeError, "steps must be a Steps or None");
        return -1;
    }
    *steps = (Steps *)Py_NewRef(value);
    return 0;
}

static PyObject *hook_get_steps(PyObject *op, void *unused) {
    Hook *self = (Hook *)op;
    return Py_NewRef(self->steps != NULL ? (PyObject *)self->steps : Py_None);
}

static int hook_set_steps(PyObject *op, PyObject *value, void *unused) {
    Steps *steps;
    if (steps_or_none(value, &steps) < 0) return -1;
    Py_XSETREF(((Hook *)op)->steps, steps);
    return 0;
}

/* copy.copy / copy.deepcopy (of an optimizer holding this hook, say): the same hook, as for a function. */
static PyObject *hook_copy(PyObject *self, PyObject *unused) { return Py_NewRef(self); }

static PyMethodDef hook_methods[] = {
    {"__copy__", hook_copy, METH_NOARGS, NULL},
    {"__deepcopy__", hook_copy, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef hook_getset[] = {
    {"__wrapped__", hook_get_wrapped, NULL, "The wrapped callable.", NULL},
    {"__doc__", hook_get_doc, NULL, NULL, NULL},
    {"steps", hook_get_steps, hook_set_steps, "The Steps this hook feeds (None: the Python hook does all).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *hook_new(PyTypeObject *type, PyObject *steps, PyObject *original, PyObject *fallback, int variant,
                          vectorcallfunc call) {
    Steps *fed;
    if (steps_or_none(steps, &fed) < 0) return NULL;
    Hook *self = (Hook *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_XDECREF(fed);
        return NULL;
    }
    self->steps = fed;
    self->original = Py_XNewRef(original);
    self->fallback = Py_NewRef(fallback);
    self->variant = variant;
    self->vectorcall = call;
    self->serial = ++hook_serial;
    return (PyObject *)self;
}

/* The Steps that handles this call, or NULL: the Python hook does all of it. */
static inline Steps *hook_steps(Hook *self, size_t nargsf) {
    Steps *steps = self->steps;
    return steps != NULL && steps->enabled && PyVectorcall_NARGS(nargsf) >= 1 ? steps : NULL;
}

/* The Python hook, after the step open here went to Python. */
static inline PyObject *defer(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (self->steps != NULL) steps_hand_over(self->steps);
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* ------------------------------------------------------------------ Timer: Forward and Backward */

/* The loss: the tensor backward() is called on, when it has one element, or the loss GradScaler.scale() was given
 * when that tensor is what it returned; added to the step's (item() on CPU, detach() else: see Loss). */
static int record_loss(Steps *steps, PyObject *tensor) {
    PyObject *numel = PyObject_CallMethodNoArgs(tensor, s_numel);
    if (numel == NULL) return -1;
    long long count = PyLong_AsLongLong(numel);
    Py_DECREF(numel);
    if (count == -1 && PyErr_Occurred()) return -1;
    if (count != 1) return 0;
    Py_INCREF(tensor);
    PyObject *scaled = PyList_GET_ITEM(steps->scaled, 0); /* None, or (weakref to the scaled tensor, the loss) */
    if (scaled != Py_None && PyTuple_Check(scaled) && PyTuple_GET_SIZE(scaled) == 2
        && PyWeakref_Check(PyTuple_GET_ITEM(scaled, 0)) && PyWeakref_GetObject(PyTuple_GET_ITEM(scaled, 0)) == tensor) {
        Py_SETREF(tensor, Py_NewRef(PyTuple_GET_ITEM(scaled, 1)));
        PyList_SetItem(steps->scaled, 0, Py_NewRef(Py_None));
    }
    PyObject *is_cpu = PyObject_GetAttr(tensor, s_is_cpu);
    if (is_cpu == NULL) goto error;
    Py_DECREF(is_cpu);
    PyObject *loss = PyObject_CallMethodNoArgs(tensor, is_cpu == Py_True ? s_item : s_detach);
    Py_DECREF(tensor);
    if (loss == NULL) return -1;
    Loss *into = &steps->loss_value;
    if (is_cpu == Py_True) {
        double value = PyFloat_AsDouble(loss);
        Py_DECREF(loss);
        if (value == -1.0 && PyErr_Occurred()) return -1;
        into->sum += value;
        into->count++;
        return 0;
    }
    if (into->tensors == NULL && (into->tensors = PyObject_CallNoArgs(steps->sum_type)) == NULL) {
        Py_DECREF(loss);
        return -1;
    }
    int failed = PyList_Append(into->tensors, loss);
    Py_DECREF(loss);
    return failed;
error:
    Py_DECREF(tensor);
    return -1;
}

/* 1: a module in training mode (an evaluation forward goes to Python, which makes its step an eval step); 0: not. */
static int in_training(PyObject *module) {
    PyObject *training = PyObject_GetAttr(module, s_training);
    if (training == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(training);
    return training == Py_True;
}

/* 1: gradients are on (torch.is_grad_enabled()): a forward without them is an evaluation (Python's, too). */
static int grad_enabled(Steps *steps) {
    PyObject *enabled = PyObject_CallNoArgs(steps->grad_enabled);
    if (enabled == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(enabled);
    return enabled == Py_True;
}

static PyObject *timer_call(Hook *self, Steps *steps, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    int region = self->variant;
    if ((region == FORWARD && (!in_training(args[0]) || !grad_enabled(steps))) || !steps_enter(steps, region))
        return defer(self, args, nargsf, kwnames);
    steps->saw_work = 1;
    if (region == BACKWARD) {
        steps->saw_backward = 1;
        /* inside optimizer.step(closure): the loss of its first evaluation only, the one step() returns */
        int counted = steps->loss && !(steps->optimizer_nesting > 0 && steps->closure_evaluated);
        if (steps->optimizer_nesting > 0) steps->closure_evaluated = 1;
        if (counted && record_loss(steps, args[0]) < 0) {
            steps_fail(steps);
            return defer(self, args, nargsf, kwnames);
        }
    }
    unsigned long long generation = steps->generation;
    int depth = steps_begin_region(steps);
    long long start = now_ns();
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    steps_end_region(steps, region, start, now_ns(), depth, generation);
    return result;
}

/* The Steps is held for the whole call: code the call runs (a hook inside backward(), another thread meanwhile)
 * may give this hook another Steps (Backward.steps is the newest instrumentation's) and drop the last other
 * reference to this one, which the end of the call still writes to. */
static PyObject *timer_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Hook *self = (Hook *)op;
    Steps *steps = hook_steps(self, nargsf);
    if (steps == NULL) return defer(self, args, nargsf, kwnames);
    Py_INCREF(steps);
    PyObject *result = timer_call(self, steps, args, nargsf, kwnames);
    Py_DECREF(steps);
    return result;
}

static PyTypeObject ForwardType, BackwardType;

static PyObject *timer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *steps, *original, *fallback;
    if (!PyArg_ParseTuple(args, "OOO", &steps, &original, &fallback)) return NULL;
    if (!PyCallable_Check(original) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "original and fallback must be callable");
        return NULL;
    }
    int region = PyType_IsSubtype(type, &ForwardType) ? FORWARD : BACKWARD;
    return hook_new(type, steps, original, fallback, region, timer_vectorcall);
}

/* A method descriptor: model(x) and loss.backward() call it with the object first, without a bound method. */
#define TIMER_TYPE(NAME, DOC)                                                                                        \
    {                                                                                                                \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otelprof.integrations._torch_native." NAME,                        \
        .tp_basicsize = sizeof(Hook), .tp_dealloc = hook_dealloc,                                                    \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR, \
        .tp_traverse = hook_traverse, .tp_clear = hook_clear, .tp_vectorcall_offset = offsetof(Hook, vectorcall),   \
        .tp_call = PyVectorcall_Call, .tp_descr_get = hook_descr_get, .tp_getattro = hook_getattro,                  \
        .tp_getset = hook_getset, .tp_methods = hook_methods, .tp_new = timer_new, .tp_doc = DOC,                    \
    }

static PyTypeObject ForwardType = TIMER_TYPE("Forward", "Forward(steps, original, fallback): the instrumented "
                                                        "subclass's forward, timed.");
static PyTypeObject BackwardType = TIMER_TYPE("Backward", "Backward(steps, original, fallback): Tensor.backward, "
                                                          "timed, with the loss.");

/* ------------------------------------------------------------------ OptimizerHook */

static int record_learning_rate(Steps *steps, PyObject *optimizer) {
    PyObject *groups = PyObject_GetAttr(optimizer, s_param_groups);
    if (groups == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    int failed = 0;
    if (PyList_Check(groups) && PyList_GET_SIZE(groups) > 0 && PyDict_Check(PyList_GET_ITEM(groups, 0))) {
        PyObject *lr = PyDict_GetItemWithError(PyList_GET_ITEM(groups, 0), s_lr);
        if (lr != NULL) {
            lr = PyFloat_CheckExact(lr) ? Py_NewRef(lr) : PyObject_CallOneArg(steps->learning_rate, lr);
            if (lr == NULL)
                failed = -1;
            else
                Py_XSETREF(steps->lr_value, lr);
        } else if (PyErr_Occurred()) {
            failed = -1;
        }
    }
    Py_DECREF(groups);
    return failed;
}

/* The end of optimizer.step(): the region, the learning rate, CUDA memory, and the step closes. -2: a
 * step-boundary callback raised on purpose (StopTraining); -1: error. */
static int optimizer_end(Steps *steps, PyObject *optimizer) {
    long long end = now_ns();
    steps_end_region(steps, OPTIMIZER, steps->optimizer_start, end, steps->optimizer_depth, steps->generation);
    if (record_learning_rate(steps, optimizer) < 0) return -1;
    /* CUDA memory gauges once CUDA is initialized (the module flag first: no call into torch on CPU) */
    PyObject *initialized = PyDict_GetItemWithError(steps->cuda_globals, s_initialized);
    if (initialized == NULL && PyErr_Occurred()) return -1;
    if (initialized == NULL || PyObject_IsTrue(initialized) == 1) {
        PyObject *done = PyObject_CallNoArgs(steps->cuda_memory);
        if (done == NULL) return -1;
        Py_DECREF(done);
    }
    return steps_close(steps, end);
}

static PyObject *optimizer_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Hook *self = (Hook *)op;
    Steps *steps = hook_steps(self, nargsf);
    if (!self->variant) { /* the pre-hook */
        if (steps == NULL || !steps_enter(steps, OPTIMIZER)) return defer(self, args, nargsf, kwnames);
        if (++steps->optimizer_nesting > 1) Py_RETURN_NONE; /* a step() calling its base class's: time the outer */
        steps->closure_evaluated = 0;
        steps->saw_work = 1;
        steps->optimizer_depth = steps_begin_region(steps);
        steps->optimizer_start = now_ns();
        Py_RETURN_NONE;
    }
    if (steps == NULL || !steps->open || PyThread_get_thread_ident() != steps->thread || steps->optimizer_nesting < 1)
        return defer(self, args, nargsf, kwnames);
    if (--steps->optimizer_nesting > 0) Py_RETURN_NONE;
    int ended = optimizer_end(steps, args[0]);
    if (ended == -2) return NULL;
    if (ended < 0) steps_fail(steps);
    Py_RETURN_NONE;
}

static PyObject *optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *steps, *fallback;
    int post;
    if (!PyArg_ParseTuple(args, "OOp", &steps, &fallback, &post)) return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    return hook_new(type, steps, NULL, fallback, post, optimizer_vectorcall);
}

static PyTypeObject OptimizerHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otelprof.integrations._torch_native.OptimizerHook",
    .tp_basicsize = sizeof(Hook),
    .tp_dealloc = hook_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = hook_traverse,
    .tp_clear = hook_clear,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getset = hook_getset,
    .tp_methods = hook_methods,
    .tp_new = optimizer_new,
    .tp_doc = "OptimizerHook(steps, fallback, post): an optimizer step pre-hook or post-hook.",
};

/* ------------------------------------------------------------------ Iterator */

/* The Python proxy's __next__ (the Python hook), after the step open here went to Python. */
static PyObject *iterator_fallback(Hook *self) {
    steps_hand_over(self->steps);
    return Py_TYPE(self->fallback)->tp_iternext(self->fallback);
}

/* The batch size: the first dimension of the first tensor of an (inputs, targets) batch, else the Python
 * helper's answer (mappings, nesting); 0 when there is none. */
static long long batch_size(Steps *steps, PyObject *batch) {
    if ((PyTuple_CheckExact(batch) || PyList_CheckExact(batch)) && PySequence_Fast_GET_SIZE(batch) > 0) {
        PyObject *first = PySequence_Fast_GET_ITEM(batch, 0);
        if (Py_TYPE(first) == (PyTypeObject *)steps->tensor_type) {
            PyObject *shape = PyObject_GetAttr(first, s_shape);
            if (shape == NULL) return -1;
            long long size = 0;
            if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) > 0) size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, 0));
            Py_DECREF(shape);
            return size;
        }
    }
    PyObject *size = PyObject_CallOneArg(steps->batch_size, batch);
    if (size == NULL) return -1;
    long long value = size == Py_None ? 0 : PyLong_AsLongLong(size);
    Py_DECREF(size);
    return value;
}

/* The batch's samples, into the step it was fetched in: here, or (handed over since) the Python one. */
static void count_samples(Steps *steps, PyObject *batch, unsigned long long generation) {
    long long size = batch_size(steps, batch);
    if (size < 0 || (size == 0 && PyErr_Occurred())) {
        steps_fail(steps);
    } else if (size > 0 && steps->open && steps->generation == generation) {
        steps->samples += size; /* summed: gradient accumulation fetches several batches */
    } else if (size > 0) {
        PyObject *count = PyLong_FromLongLong(size);
        PyObject *done = count ? PyObject_CallFunctionObjArgs(steps->add_into, step_of(steps, generation),
                                                              steps->scalar_names[SAMPLES], count, NULL) : NULL;
        Py_XDECREF(count);
        if (done == NULL)
            steps_fail(steps);
        else
            Py_DECREF(done);
    }
}

static PyObject *iterator_next(PyObject *op) {
    Hook *self = (Hook *)op;
    Steps *steps = self->steps;
    if (!steps->enabled) return Py_TYPE(self->fallback)->tp_iternext(self->fallback);
    /* a fetch ends a step a fetch opened when no backward came (evaluation without eval mode); not a step that
     * holds only another iterator's fetch: a batch peeked at before the loop, or a second loader zipped in */
    if (steps->open && PyThread_get_thread_ident() == steps->thread && steps->leader == FETCH
        && !steps->saw_backward && (steps->saw_work || steps->fetcher == 0 || steps->fetcher == self->serial)) {
        int closed = steps_close(steps, now_ns());
        if (closed == -2) return NULL;
        if (closed < 0) steps_fail(steps);
    }
    if (!steps_enter(steps, FETCH)) return iterator_fallback(self);
    if (steps->leader == FETCH && steps->fetcher == 0 && steps->regions == 0) steps->fetcher = self->serial;
    unsigned long long generation = steps->generation;
    int depth = steps_begin_region(steps);
    long long start = now_ns();
    PyObject *batch = Py_TYPE(self->original)->tp_iternext(self->original);
    steps_end_region(steps, FETCH, start, now_ns(), depth, generation);
    if (batch == NULL) {
        /* the epoch ended, or the loader raised (the error goes on as it came): drop a step that only saw this
         * fetch */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (steps->open && steps->generation == generation && !steps->saw_work && steps_cancel(steps) < 0)
            steps_fail(steps);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (steps->count_samples) count_samples(steps, batch, generation);
    return batch;
}

static PyObject *iterator_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *steps, *iterator, *fallback;
    if (!PyArg_ParseTuple(args, "O!OO", &StepsType, &steps, &iterator, &fallback)) return NULL;
    if (!PyIter_Check(iterator) || !PyIter_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Iterator needs two iterators");
        return NULL;
    }
    return hook_new(type, steps, iterator, fallback, 0, NULL);
}

static Py_ssize_t iterator_length(PyObject *op) { return PyObject_Size(((Hook *)op)->original); }

static PySequenceMethods iterator_as_sequence = {.sq_length = iterator_length};

/* Attributes and len() are the data loader iterator's. */
static PyTypeObject IteratorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otelprof.integrations._torch_native.Iterator",
    .tp_basicsize = sizeof(Hook),
    .tp_dealloc = hook_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = hook_traverse,
    .tp_clear = hook_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = iterator_next,
    .tp_getattro = hook_getattro,
    .tp_as_sequence = &iterator_as_sequence,
    .tp_new = iterator_new,
    .tp_doc = "Iterator(steps, iterator, fallback): a data-loader iterator whose fetches are timed.",
};

/* ------------------------------------------------------------------ module */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otelprof.integrations._torch_native",
    "The PyTorch integration's hot path in C (optional: the Python hooks do the same work).", -1, NULL,
};

PyMODINIT_FUNC PyInit__torch_native(void) {
    struct {
        PyObject **slot;
        const char *text;
    } strings[] = {{&s_step, "step"}, {&s_training, "training"}, {&s_numel, "numel"}, {&s_is_cpu, "is_cpu"},
                   {&s_item, "item"}, {&s_detach, "detach"}, {&s_shape, "shape"}, {&s_param_groups, "param_groups"},
                   {&s_lr, "lr"}, {&s_queue, "queue"}, {&s_capacity, "capacity"},
                   {&s_queue_dropped, "queue_dropped"}, {&s_append, "append"}, {&s_active, "_active"},
                   {&s_initialized, "_initialized"}, {&s_max_regions, "MAX_STEP_ANNOTATIONS"}};
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++)
        if ((*strings[i].slot = PyUnicode_InternFromString(strings[i].text)) == NULL) return NULL;
    PyTypeObject *types[] = {&StepsType, &ForwardType, &BackwardType, &OptimizerHookType, &IteratorType};
    const char *names[] = {"Steps", "Forward", "Backward", "OptimizerHook", "Iterator"};
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    for (int i = 0; i < 5; i++) {
        if (PyType_Ready(types[i]) < 0) return NULL;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) return NULL;
    }
    return m;
}
