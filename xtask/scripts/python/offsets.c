/*
 * Prints the CPython struct offsets infertrace's stack sampler needs (agent/src/discover/python.rs,
 * table LAYOUTS), from a CPython version's own headers:
 *
 *   cc -I ~/.pyenv/versions/3.12.1/include/python3.12 -o offsets xtask/scripts/python/offsets.c
 *   ./offsets
 *
 * Internal headers (Include/internal/pycore_*.h) are installed with CPython; Py_BUILD_CORE
 * makes them usable. The table's rows for 3.10.13, 3.11.7, 3.12.1 and 3.13.0 are this program's
 * output. 3.10 has no interpreter frames: its thread state points to a PyFrameObject chain (f_back),
 * its code objects no co_qualname (co_name is printed in its place), and its thread states no
 * native thread id (thread_id is pthread_self(), the thread's TLS base on x86-64 glibc).
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#else
#include <frameobject.h>
#endif
int main(void) {
    printf("runtime.interpreters_head=%zu\n", offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030B0000
    printf("interp.threads_head=%zu\n", offsetof(PyInterpreterState, threads.head));
    printf("tstate.next=%zu\n", offsetof(PyThreadState, next));
    printf("tstate.native_thread_id=%zu\n", offsetof(PyThreadState, native_thread_id));
#if PY_VERSION_HEX >= 0x030D0000
    printf("tstate.current_frame=%zu\n", offsetof(PyThreadState, current_frame));
    printf("frame.code=%zu\n", offsetof(_PyInterpreterFrame, f_executable));
#else
    printf("tstate.cframe=%zu\n", offsetof(PyThreadState, cframe));
    printf("cframe.current_frame=%zu\n", offsetof(_PyCFrame, current_frame));
    printf("frame.code=%zu\n", offsetof(_PyInterpreterFrame, f_code));
#endif
    printf("frame.previous=%zu\n", offsetof(_PyInterpreterFrame, previous));
    printf("frame.owner=%zu\n", offsetof(_PyInterpreterFrame, owner));
    printf("code.qualname=%zu\n", offsetof(PyCodeObject, co_qualname));
#else
    printf("interp.threads_head=%zu\n", offsetof(PyInterpreterState, tstate_head));
    printf("tstate.next=%zu\n", offsetof(PyThreadState, next));
    printf("tstate.thread_id=%zu\n", offsetof(PyThreadState, thread_id));
    printf("tstate.frame=%zu\n", offsetof(PyThreadState, frame));
    printf("frame.code=%zu\n", offsetof(PyFrameObject, f_code));
    printf("frame.previous=%zu\n", offsetof(PyFrameObject, f_back));
    printf("code.name=%zu\n", offsetof(PyCodeObject, co_name));
#endif
    printf("code.filename=%zu\n", offsetof(PyCodeObject, co_filename));
    printf("code.firstlineno=%zu\n", offsetof(PyCodeObject, co_firstlineno));
    printf("unicode.ascii_data=%zu\n", sizeof(PyASCIIObject));
    printf("unicode.compact_data=%zu\n", sizeof(PyCompactUnicodeObject));
    printf("unicode.state=%zu\n", offsetof(PyASCIIObject, state));
    printf("unicode.length=%zu\n", offsetof(PyASCIIObject, length));
    printf("object.type=%zu\n", offsetof(PyObject, ob_type));
#if PY_VERSION_HEX >= 0x030D0000
    /* Where _Py_DebugOffsets (at the start of _PyRuntime) holds the offsets above. */
#define DEBUG(f) printf("debug." #f "=%zu\n", offsetof(_Py_DebugOffsets, f))
    DEBUG(runtime_state.interpreters_head);
    DEBUG(interpreter_state.threads_head);
    DEBUG(thread_state.next);
    DEBUG(thread_state.current_frame);
    DEBUG(thread_state.native_thread_id);
    DEBUG(interpreter_frame.previous);
    DEBUG(interpreter_frame.executable);
    DEBUG(interpreter_frame.owner);
    DEBUG(code_object.filename);
    DEBUG(code_object.qualname);
    DEBUG(code_object.firstlineno);
    DEBUG(unicode_object.state);
    DEBUG(unicode_object.length);
    DEBUG(unicode_object.asciiobject_size);
#endif
    return 0;
}
