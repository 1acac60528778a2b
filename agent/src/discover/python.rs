//! CPython in a process: which binary holds the interpreter (a `libpython3.X.so` or the
//! executable itself, as Debian's statically linked python3.11), its version, where
//! `_PyRuntime` is in the process, and the struct offsets the sampler walks frames with.
//!
//! Only dynamic symbols are used (`_PyRuntime` and `Py_Version` are exported by every build:
//! extensions link against them), so builds without debug information work.
//!
//! The offsets come from each version's own headers (`Include/internal/pycore_*.h` and
//! `Include/cpython/*.h`, installed with CPython): `xtask/scripts/python/offsets.c` prints them
//! with `offsetof` when compiled against a version's headers, and the table below is its
//! output for the release named on each row. They hold for release builds of that minor
//! version (internal layouts do not change within one). From 3.13 on, the interpreter
//! publishes its own offsets in `_Py_DebugOffsets` at the start of `_PyRuntime`: those are read
//! from the process and preferred, the table being the fallback. 3.10 differs most: frames are
//! `PyFrameObject`s (the walk follows `f_back`), code objects have no qualified name (`co_name`
//! stands in), and thread states no kernel thread id (`thread_id` is the TLS base).
use std::{
    collections::HashMap,
    os::unix::fs::{FileExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use infertrace_common::{PY_NO_OFFSET, PyOffsets};
use object::{Object, ObjectSegment, ObjectSymbol};

use super::uprobe_sites::file_offset;

/// Offsets userspace needs to name a code object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeOffsets {
    /// `PyCodeObject.co_qualname`, `.co_filename`, `.co_firstlineno` (int).
    pub qualname: u32,
    pub filename: u32,
    pub firstlineno: u32,
    /// `sizeof(PyASCIIObject)`, `sizeof(PyCompactUnicodeObject)`: where a compact string's
    /// characters start, ASCII or not.
    pub ascii_data: u32,
    pub compact_data: u32,
    /// `PyASCIIObject.state` (bitfield) and `.length`.
    pub unicode_state: u32,
    pub unicode_length: u32,
}

/// One supported CPython minor version.
struct Layout {
    version: (u8, u8),
    /// The release the offsets were printed from.
    from: &'static str,
    frames: PyOffsets,
    code: CodeOffsets,
    /// Thread states hold the thread's TLS base (`pthread_self()`), not its kernel id.
    tls_thread_ids: bool,
}

/// Code and string offsets of 3.12 and 3.13 (`PyASCIIObject` lost its `wstr` in 3.12).
const CODE_SINCE_3_12: CodeOffsets = CodeOffsets {
    qualname: 128,
    filename: 112,
    firstlineno: 68,
    ascii_data: 40,
    compact_data: 56,
    unicode_state: 32,
    unicode_length: 16,
};

/// `offsets.c`'s output per version (see the module docs).
const LAYOUTS: &[Layout] = &[
    Layout {
        version: (3, 10),
        from: "3.10.13",
        // No interpreter frames yet: the thread state points to a `PyFrameObject` chain.
        frames: PyOffsets {
            runtime_interpreters_head: 32,
            interp_threads_head: 8,
            tstate_next: 8,
            // `thread_id`: the TLS base.
            tstate_native_thread_id: 176,
            tstate_frame: 24,
            cframe_current_frame: PY_NO_OFFSET,
            frame_code: 32,
            frame_previous: 24,
            // No owner field: any readable byte of the frame; no frame is skipped.
            frame_owner: 32,
            owner_cstack: PY_NO_OFFSET,
        },
        code: CodeOffsets {
            // No `co_qualname` before 3.11: `co_name` (functions named without their class).
            qualname: 112,
            filename: 104,
            firstlineno: 40,
            ascii_data: 48,
            compact_data: 72,
            unicode_state: 32,
            unicode_length: 16,
        },
        tls_thread_ids: true,
    },
    Layout {
        version: (3, 11),
        from: "3.11.7",
        frames: PyOffsets {
            runtime_interpreters_head: 40,
            interp_threads_head: 16,
            tstate_next: 8,
            tstate_native_thread_id: 160,
            tstate_frame: 56,
            cframe_current_frame: 8,
            frame_code: 32,
            frame_previous: 48,
            frame_owner: 69,
            // 3.11 has no C-stack shim frames.
            owner_cstack: PY_NO_OFFSET,
        },
        code: CodeOffsets {
            qualname: 128,
            filename: 112,
            firstlineno: 72,
            ascii_data: 48,
            compact_data: 72,
            unicode_state: 32,
            unicode_length: 16,
        },
        tls_thread_ids: false,
    },
    Layout {
        version: (3, 12),
        from: "3.12.1",
        frames: PyOffsets {
            runtime_interpreters_head: 40,
            interp_threads_head: 72,
            tstate_next: 8,
            tstate_native_thread_id: 144,
            tstate_frame: 56,
            cframe_current_frame: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_owner: 70,
            // FRAME_OWNED_BY_CSTACK (pycore_frame.h).
            owner_cstack: 3,
        },
        code: CODE_SINCE_3_12,
        tls_thread_ids: false,
    },
    Layout {
        version: (3, 13),
        from: "3.13.0",
        frames: PyOffsets {
            runtime_interpreters_head: 632,
            interp_threads_head: 7344,
            tstate_next: 8,
            tstate_native_thread_id: 160,
            tstate_frame: 72,
            cframe_current_frame: PY_NO_OFFSET,
            frame_code: 0,
            frame_previous: 8,
            frame_owner: 70,
            owner_cstack: 3,
        },
        code: CODE_SINCE_3_12,
        tls_thread_ids: false,
    },
];

#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("pid {0}: no CPython interpreter in its maps (not a Python process)")]
    NotPython(u32),
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not an ELF object infertrace can read: {1}")]
    Elf(PathBuf, object::Error),
    #[error("{0} does not export _PyRuntime")]
    NoRuntime(PathBuf),
    #[error("CPython {}.{} is not supported (infertrace knows {})", .0.0, .0.1, known_versions())]
    Unsupported((u8, u8)),
    #[error(
        "{0}: the interpreter's version could not be told (no Py_Version, no version in its name)"
    )]
    NoVersion(PathBuf),
}

fn known_versions() -> String {
    LAYOUTS
        .iter()
        .map(|l| format!("{}.{}", l.version.0, l.version.1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where 3.13's `_Py_DebugOffsets` (at the start of `_PyRuntime`) holds each offset the
/// sampler needs (`offsets.c` prints them against 3.13's headers). Each field there is a u64.
struct DebugPositions {
    interpreters_head: u64,
    threads_head: u64,
    tstate_next: u64,
    current_frame: u64,
    native_thread_id: u64,
    frame_previous: u64,
    frame_executable: u64,
    frame_owner: u64,
    code_filename: u64,
    code_qualname: u64,
    code_firstlineno: u64,
    unicode_state: u64,
    unicode_length: u64,
    ascii_size: u64,
}

const DEBUG_OFFSETS_3_13: DebugPositions = DebugPositions {
    interpreters_head: 40,
    threads_head: 72,
    tstate_next: 168,
    current_frame: 184,
    native_thread_id: 200,
    frame_previous: 232,
    frame_executable: 240,
    frame_owner: 264,
    code_filename: 280,
    code_qualname: 296,
    code_firstlineno: 312,
    unicode_state: 544,
    unicode_length: 552,
    ascii_size: 560,
};

/// The layout the running 3.13 interpreter publishes, when its `_Py_DebugOffsets` reads back
/// with the right cookie and version.
fn layout_from_debug_offsets(
    memory: &Memory,
    runtime: u64,
    version: (u8, u8),
) -> Option<(PyOffsets, CodeOffsets)> {
    if version != (3, 13) || memory.bytes(runtime, 8)? != b"xdebugpy" {
        return None;
    }
    let hex = memory.u64_at(runtime + 8)?;
    if ((hex >> 24) as u8, (hex >> 16) as u8) != version {
        return None;
    }
    let p = &DEBUG_OFFSETS_3_13;
    let at =
        |position: u64| -> Option<u32> { u32::try_from(memory.u64_at(runtime + position)?).ok() };
    let ascii_data = at(p.ascii_size)?;
    Some((
        PyOffsets {
            runtime_interpreters_head: at(p.interpreters_head)?,
            interp_threads_head: at(p.threads_head)?,
            tstate_next: at(p.tstate_next)?,
            tstate_native_thread_id: at(p.native_thread_id)?,
            tstate_frame: at(p.current_frame)?,
            cframe_current_frame: PY_NO_OFFSET,
            frame_code: at(p.frame_executable)?,
            frame_previous: at(p.frame_previous)?,
            frame_owner: at(p.frame_owner)?,
            // FRAME_OWNED_BY_CSTACK: a constant, not an offset (pycore_frame.h).
            owner_cstack: 3,
        },
        CodeOffsets {
            qualname: at(p.code_qualname)?,
            filename: at(p.code_filename)?,
            firstlineno: at(p.code_firstlineno)?,
            ascii_data,
            // PyCompactUnicodeObject is PyASCIIObject plus utf8_length and utf8.
            compact_data: ascii_data + 16,
            unicode_state: at(p.unicode_state)?,
            unicode_length: at(p.unicode_length)?,
        },
    ))
}

/// [`PythonProcess::offsets_from`] when the interpreter published its offsets.
pub const PUBLISHED: &str = "_Py_DebugOffsets";

/// A Python process as the sampler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonProcess {
    pub pid: u32,
    pub version: (u8, u8),
    /// The binary holding the interpreter, as this process can open it.
    pub binary: PathBuf,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    pub frames: PyOffsets,
    pub code: CodeOffsets,
    /// Where the offsets come from: the interpreter's `_Py_DebugOffsets`, or the table row
    /// (the release it was printed from).
    pub offsets_from: &'static str,
    /// Its thread states hold each thread's TLS base, not its kernel id (3.10): the sampler
    /// needs the kernel's `task_struct.thread.fsbase` offset.
    pub tls_thread_ids: bool,
}

/// The table's offsets for a version (the fallback when the interpreter publishes none).
pub fn table_layout(version: (u8, u8)) -> Option<(PyOffsets, CodeOffsets)> {
    LAYOUTS
        .iter()
        .find(|l| l.version == version)
        .map(|l| (l.frames, l.code))
}

/// Binaries seen most: past it the cache starts over.
const MAX_BINARIES: usize = 1024;

/// What each binary file (device, inode) says of its interpreter, read once: every process of
/// an engine maps the same libpython or executable, and a process that is not Python at all is
/// told by its executable, which need not be read and parsed again at each fork or exec.
#[derive(Debug, Default)]
pub struct BinaryCache {
    symbols: HashMap<(u64, u64), RuntimeSymbols>,
}

impl BinaryCache {
    fn symbols_of(&mut self, binary: &Path) -> Result<RuntimeSymbols, PythonError> {
        let meta = std::fs::metadata(binary).map_err(|e| PythonError::Read(binary.into(), e))?;
        let key = (meta.dev(), meta.ino());
        if let Some(found) = self.symbols.get(&key) {
            return Ok(*found);
        }
        let bytes = std::fs::read(binary).map_err(|e| PythonError::Read(binary.into(), e))?;
        let found = runtime_symbols(&bytes).map_err(|e| PythonError::Elf(binary.into(), e))?;
        if self.symbols.len() >= MAX_BINARIES {
            self.symbols.clear();
        }
        self.symbols.insert(key, found);
        Ok(found)
    }
}

/// The interpreter of process `pid`; `binaries` keeps what its files said.
pub fn discover(pid: u32, binaries: &mut BinaryCache) -> Result<PythonProcess, PythonError> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| PythonError::Read(format!("/proc/{pid}/maps").into(), e))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let path = interpreter_in_maps(&maps, exe.as_deref()).ok_or(PythonError::NotPython(pid))?;
    let binary = PathBuf::from(format!("/proc/{pid}/root{path}"));
    let found = binaries.symbols_of(&binary)?;
    let is_libpython = exe.as_deref() != Some(Path::new(path));
    let runtime = match found.runtime {
        Some(runtime) => runtime,
        // An executable without the interpreter: not a Python process.
        None if !is_libpython => return Err(PythonError::NotPython(pid)),
        None => return Err(PythonError::NoRuntime(binary.clone())),
    };
    let version = found
        .version
        .or_else(|| version_in_name(path))
        .ok_or_else(|| PythonError::NoVersion(binary.clone()))?;
    let layout = LAYOUTS
        .iter()
        .find(|l| l.version == version)
        .ok_or(PythonError::Unsupported(version))?;
    let base = load_base(
        &maps,
        path,
        found.first_load_vaddr,
        found.position_independent,
    )
    .ok_or(PythonError::NotPython(pid))?;
    let runtime = base + runtime;
    let published = Memory::open(pid)
        .ok()
        .and_then(|memory| layout_from_debug_offsets(&memory, runtime, version))
        // The sampler reads a frame's fields in one read of at most PY_FRAME_READ_MAX bytes.
        .filter(|(frames, _)| frames.frame_span().is_some());
    let (frames, code, from) = match published {
        Some((frames, code)) => (frames, code, PUBLISHED),
        None => (layout.frames, layout.code, layout.from),
    };
    tracing::debug!(
        "pid {pid}: CPython {}.{} in {path} (offsets of {from}), _PyRuntime at {runtime:#x}",
        version.0,
        version.1,
    );
    Ok(PythonProcess {
        pid,
        version,
        binary,
        runtime,
        frames,
        code,
        offsets_from: from,
        tls_thread_ids: layout.tls_thread_ids,
    })
}

/// The file holding the interpreter: a mapped `libpython3.X.so*`, else the executable when it
/// is mapped (a static interpreter: the caller checks that it exports `_PyRuntime`).
fn interpreter_in_maps<'a>(maps: &'a str, exe: Option<&Path>) -> Option<&'a str> {
    let paths = || {
        maps.lines()
            .filter_map(|line| line.split_whitespace().nth(5))
    };
    paths()
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libpython3.") && n.contains(".so"))
        })
        .or_else(|| {
            let exe = exe?;
            paths().find(|p| Path::new(p) == exe)
        })
        .filter(|p| p.starts_with('/'))
}

/// What the interpreter's ELF says of itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RuntimeSymbols {
    /// Virtual address of `_PyRuntime` in the file.
    runtime: Option<u64>,
    /// `Py_Version` (3.11+): (major, minor) of PY_VERSION_HEX.
    version: Option<(u8, u8)>,
    first_load_vaddr: u64,
    position_independent: bool,
}

fn runtime_symbols(elf: &[u8]) -> Result<RuntimeSymbols, object::Error> {
    let file = object::File::parse(elf)?;
    let mut out = RuntimeSymbols {
        first_load_vaddr: file.segments().map(|s| s.address()).min().unwrap_or(0),
        position_independent: file.kind() != object::ObjectKind::Executable,
        ..RuntimeSymbols::default()
    };
    for symbol in file.dynamic_symbols() {
        match symbol.name() {
            Ok("_PyRuntime") if symbol.is_definition() => out.runtime = Some(symbol.address()),
            Ok("Py_Version") if symbol.is_definition() => {
                out.version = file_offset(&file, symbol.address())
                    .and_then(|at| usize::try_from(at).ok())
                    .and_then(|at| elf.get(at..at + 4))
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .map(|hex| ((hex >> 24) as u8, (hex >> 16) as u8));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `python3.11`, `libpython3.12.so.1.0` -> (3, 11), (3, 12).
fn version_in_name(path: &str) -> Option<(u8, u8)> {
    let name = Path::new(path).file_name()?.to_str()?;
    let rest = &name[name.find("python3.")? + "python3.".len()..];
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((3, minor.parse().ok()?))
}

/// Where the file's address 0 is in the process: its first mapping (file offset 0) less the
/// first segment's page-aligned address; 0 for a non-PIE executable.
fn load_base(maps: &str, path: &str, first_vaddr: u64, pie: bool) -> Option<u64> {
    if !pie {
        return Some(0);
    }
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let range = fields.next()?;
        let offset = fields.nth(1)?;
        if fields.nth(2)? != path || u64::from_str_radix(offset, 16).ok()? != 0 {
            return None;
        }
        let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
        Some(start - (first_vaddr & !0xfff))
    })
}

/// Bytes read at once of a `str` object: its header (at most 40 bytes in the supported
/// versions) and the text of a name or path up to about 200 characters. A read of another
/// process's memory stops at the first page it cannot read: a longer text, or one cut there,
/// is read again where it lies.
const STRING_READ: usize = 256;

/// The `N` bytes at `offset` in an object's bytes read at once, when they are all there.
fn field_bytes<const N: usize>(object: &[u8], offset: u32) -> Option<[u8; N]> {
    let at = offset as usize;
    object.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// Reads a Python process's memory to name its code objects.
pub struct Memory {
    file: std::fs::File,
}

impl Memory {
    pub fn open(pid: u32) -> std::io::Result<Self> {
        Ok(Self {
            file: std::fs::File::open(format!("/proc/{pid}/mem"))?,
        })
    }

    pub fn bytes(&self, at: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; len];
        self.file.read_exact_at(&mut buf, at).ok()?;
        Some(buf)
    }

    /// Up to `len` bytes at `at`: fewer where an unreadable page cuts them short.
    fn readable(&self, at: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; len];
        let n = self.file.read_at(&mut buf, at).ok()?;
        buf.truncate(n);
        Some(buf)
    }

    pub fn u64_at(&self, at: u64) -> Option<u64> {
        let b = self.bytes(at, 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    /// A `str` object's text (compact strings only, as code objects' names are; at most 512
    /// characters). One read brings the header and the text of a name up to
    /// [`STRING_READ`] bytes long (nearly all are): each read of another process's memory is a
    /// syscall, and naming code objects was most of the sampler's cost in the agent.
    fn string(&self, at: u64, o: &CodeOffsets) -> Option<String> {
        let head = self.readable(at, STRING_READ)?;
        let state = u32::from_le_bytes(field_bytes(&head, o.unicode_state)?);
        let len = usize::try_from(u64::from_le_bytes(field_bytes(&head, o.unicode_length)?))
            .ok()?
            .min(512);
        let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
        if compact == 0 {
            return None;
        }
        let data = if ascii == 1 {
            o.ascii_data
        } else {
            o.compact_data
        } as usize;
        let width = kind.clamp(1, 4) as usize;
        let size = len * width;
        let later;
        let raw = match head.get(data..data + size) {
            Some(raw) => raw,
            None => {
                later = self.bytes(at.checked_add(data as u64)?, size)?;
                &later[..]
            }
        };
        Some(
            raw.chunks(width)
                .map(|c| {
                    let mut v = 0u32;
                    for (i, b) in c.iter().enumerate() {
                        v |= u32::from(*b) << (8 * i);
                    }
                    char::from_u32(v).unwrap_or('\u{fffd}')
                })
                .collect(),
        )
    }

    /// The qualified name, file and first line of the code object at `code` (its fields read
    /// in one go).
    /// Garbage (a stack walked with wrong offsets) gives None or nonsense, never a fault.
    pub fn code_object(&self, code: u64, o: &CodeOffsets) -> Option<CodeName> {
        let end = o.qualname.max(o.filename).max(o.firstlineno) as usize + 8;
        let fields = self.bytes(code, end)?;
        let pointer = |offset: u32| Some(u64::from_le_bytes(field_bytes(&fields, offset)?));
        let name = self.string(pointer(o.qualname)?, o)?;
        let file = self.string(pointer(o.filename)?, o)?;
        Some(CodeName {
            name,
            file,
            line: i32::from_le_bytes(field_bytes(&fields, o.firstlineno)?),
        })
    }
}

/// What names a Python function in a stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CodeName {
    pub name: String,
    pub file: String,
    pub line: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interpreter_is_libpython_or_the_executable() {
        let maps = "\
55d000000000-55d000001000 r--p 00000000 fd:01 1 /usr/bin/python3.11
7f0000000000-7f0000001000 r-xp 00000000 fd:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
";
        assert_eq!(
            interpreter_in_maps(maps, Some(Path::new("/usr/bin/python3.11"))),
            Some("/usr/bin/python3.11")
        );
        let shared = "\
55d000000000-55d000001000 r--p 00000000 fd:01 1 /root/.pyenv/versions/3.11.7/bin/python3.11
7f0000000000-7f0000001000 r--p 00000000 fd:01 2 /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
";
        assert_eq!(
            interpreter_in_maps(shared, None),
            Some("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0")
        );
        assert_eq!(interpreter_in_maps("", None), None);
    }

    #[test]
    fn versions_in_names() {
        assert_eq!(version_in_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(version_in_name("/x/libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_in_name("/usr/bin/python"), None);
    }

    #[test]
    fn the_load_base_comes_from_the_first_mapping() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 2 /lib/libpython3.11.so.1.0
7f0000001000-7f0000002000 r-xp 00001000 fd:01 2 /lib/libpython3.11.so.1.0
";
        assert_eq!(
            load_base(maps, "/lib/libpython3.11.so.1.0", 0, true),
            Some(0x7f00_0000_0000)
        );
        assert_eq!(
            load_base(maps, "/lib/libpython3.11.so.1.0", 0, false),
            Some(0)
        );
        assert_eq!(load_base(maps, "/other", 0, true), None);
    }

    #[test]
    fn every_known_version_has_offsets_and_garbage_elf_is_an_error() {
        assert_eq!(known_versions(), "3.10, 3.11, 3.12, 3.13");
        for layout in LAYOUTS {
            assert!(layout.frames.frame_span().is_some(), "{}", layout.from);
        }
        assert!(runtime_symbols(b"not an elf").is_err());
    }

    /// A compact `str` laid out as CPython does (state bits, length, then the characters).
    fn fake_string(text: &str, o: &CodeOffsets) -> Vec<u8> {
        let ascii = text.is_ascii();
        let (kind, data): (u32, Vec<u8>) = if ascii {
            (1, text.as_bytes().to_vec())
        } else {
            let units: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
            (2, units)
        };
        let start = if ascii { o.ascii_data } else { o.compact_data } as usize;
        let mut object = vec![0u8; start + data.len()];
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6);
        let at = o.unicode_state as usize;
        object[at..at + 4].copy_from_slice(&state.to_le_bytes());
        let at = o.unicode_length as usize;
        object[at..at + 8].copy_from_slice(&(text.chars().count() as u64).to_le_bytes());
        object[start..].copy_from_slice(&data);
        object
    }

    #[test]
    fn code_objects_are_named_from_memory_short_and_long_names_alike() {
        let o = LAYOUTS.last().expect("a layout").code;
        let long_file = format!("/{}/engine.py", "deep".repeat(80));
        let name = fake_string("Scheduler.schedulé", &o);
        let file = fake_string(&long_file, &o);
        let mut code = vec![0u8; o.qualname.max(o.filename).max(o.firstlineno) as usize + 8];
        let put = |code: &mut Vec<u8>, at: u32, word: u64| {
            code[at as usize..at as usize + 8].copy_from_slice(&word.to_le_bytes());
        };
        put(&mut code, o.qualname, name.as_ptr() as u64);
        put(&mut code, o.filename, file.as_ptr() as u64);
        let line = o.firstlineno as usize;
        code[line..line + 4].copy_from_slice(&1234i32.to_le_bytes());
        let memory = Memory::open(std::process::id()).expect("own memory");
        assert_eq!(
            memory.code_object(code.as_ptr() as u64, &o),
            Some(CodeName {
                name: "Scheduler.schedulé".into(),
                file: long_file,
                line: 1234,
            })
        );
        assert_eq!(memory.code_object(0, &o), None);
    }
}
