//! Where a field of a kernel struct lies, from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`): aya's eBPF side has no CO-RE relocations, so a program that
//! reads a kernel struct gets the field's offset from userspace (DESIGN.md).
//!
//! Only what that needs is parsed: the type section's records (to index them by id), and the
//! members of structs. The input is untrusted bytes: every read is bounds-checked.
use std::borrow::Cow;

/// The running kernel's BTF. The capture needs it: its programs read each syscall's arguments
/// through a BTF pointer (`ebpf/src/io.rs`).
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// BTF's magic number (little-endian hosts).
const MAGIC: u16 = 0xeb9f;
/// Type kinds (include/uapi/linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
/// Longest chain of typedefs and qualifiers followed to a struct.
const MAX_ALIASES: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("reading the kernel's BTF: {0}")]
    Read(String),
    #[error("the kernel's BTF is malformed: {0}")]
    Malformed(&'static str),
    #[error("the kernel's BTF has no struct {0}")]
    NoStruct(String),
    #[error("struct {0} has no member {1} in the kernel's BTF")]
    NoMember(String, String),
}

/// One type record: its kind, name, `size`/`type` word, and where its trailing data starts.
#[derive(Clone, Copy, Debug)]
struct TypeRecord {
    kind: u32,
    name: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_type: u32,
    data: usize,
}

pub struct Btf<'a> {
    bytes: &'a [u8],
    strings: usize,
    strings_len: usize,
    /// By type id - 1 (id 0 is void).
    types: Vec<TypeRecord>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

impl<'a> Btf<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BtfError> {
        let bad = BtfError::Malformed;
        let magic = bytes.get(0..2).ok_or(bad("no header"))?;
        if u16::from_le_bytes([magic[0], magic[1]]) != MAGIC {
            return Err(bad("wrong magic (or a big-endian kernel)"));
        }
        let word = |at| {
            u32_at(bytes, at)
                .map(|w| w as usize)
                .ok_or(bad("short header"))
        };
        let (header_len, type_off, type_len, str_off, str_len) =
            (word(4)?, word(8)?, word(12)?, word(16)?, word(20)?);
        let types_start = header_len
            .checked_add(type_off)
            .ok_or(bad("type section"))?;
        let types_end = types_start
            .checked_add(type_len)
            .ok_or(bad("type section"))?;
        let strings = header_len
            .checked_add(str_off)
            .ok_or(bad("string section"))?;
        if types_end > bytes.len() || strings.saturating_add(str_len) > bytes.len() {
            return Err(bad("a section past the end"));
        }
        let mut types = Vec::new();
        let mut at = types_start;
        while at < types_end {
            let (name, info, size_or_type) = (
                u32_at(bytes, at).ok_or(bad("short type"))?,
                u32_at(bytes, at + 4).ok_or(bad("short type"))?,
                u32_at(bytes, at + 8).ok_or(bad("short type"))?,
            );
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let data = at + 12;
            let trailing = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
            types.push(TypeRecord {
                kind,
                name,
                vlen,
                kind_flag: info >> 31 == 1,
                size_or_type,
                data,
            });
            at = data + trailing;
        }
        Ok(Self {
            bytes,
            strings,
            strings_len: str_len,
            types,
        })
    }

    fn name(&self, offset: u32) -> Cow<'a, str> {
        let start = self.strings + offset as usize;
        let end = self.strings + self.strings_len;
        let text = self.bytes.get(start..end).unwrap_or_default();
        let len = text.iter().position(|&b| b == 0).unwrap_or(text.len());
        String::from_utf8_lossy(&text[..len])
    }

    fn struct_named(&self, name: &str) -> Result<&TypeRecord, BtfError> {
        self.types
            .iter()
            .find(|t| t.kind == KIND_STRUCT && t.vlen > 0 && self.name(t.name) == name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))
    }

    /// The struct a type id is, through typedefs and qualifiers.
    fn resolve_struct(&self, mut id: u32) -> Option<&TypeRecord> {
        for _ in 0..MAX_ALIASES {
            let t = self.types.get((id as usize).checked_sub(1)?)?;
            match t.kind {
                KIND_STRUCT => return Some(t),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type;
                }
                _ => return None,
            }
        }
        None
    }

    /// A member of a struct: its byte offset and its type id.
    fn member(
        &self,
        owner: &TypeRecord,
        owner_name: &str,
        name: &str,
    ) -> Result<(u32, u32), BtfError> {
        for i in 0..owner.vlen {
            let at = owner.data + 12 * i;
            let (Some(member_name), Some(ty), Some(offset)) = (
                u32_at(self.bytes, at),
                u32_at(self.bytes, at + 4),
                u32_at(self.bytes, at + 8),
            ) else {
                return Err(BtfError::Malformed("short struct member"));
            };
            if self.name(member_name) == name {
                // With kind_flag set, the low 24 bits are the bit offset.
                let bits = if owner.kind_flag {
                    offset & 0x00ff_ffff
                } else {
                    offset
                };
                return Ok((bits / 8, ty));
            }
        }
        Err(BtfError::NoMember(owner_name.to_owned(), name.to_owned()))
    }

    /// The byte offset of `path` (members of nested structs, outermost first) in struct
    /// `outer`: `("task_struct", ["thread", "fsbase"])`.
    pub fn offset_of(&self, outer: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut owner = self.struct_named(outer)?;
        let mut owner_name = outer.to_owned();
        let mut total = 0u32;
        for (i, name) in path.iter().enumerate() {
            let (offset, ty) = self.member(owner, &owner_name, name)?;
            total = total
                .checked_add(offset)
                .ok_or(BtfError::Malformed("offset overflow"))?;
            if i + 1 < path.len() {
                owner = self
                    .resolve_struct(ty)
                    .ok_or_else(|| BtfError::NoStruct(format!("{owner_name}.{name}")))?;
                owner_name = self.name(owner.name).into_owned();
            }
        }
        Ok(total)
    }
}

/// Where a task's TLS base (`task_struct.thread.fsbase`, x86-64) lies in `task_struct`, from
/// the running kernel's BTF.
pub fn task_fsbase_offset() -> Result<u32, BtfError> {
    with_kernel_btf(|btf| btf.offset_of("task_struct", &["thread", "fsbase"]))
}

/// Where the kernel keeps the mode of the file behind a task's fd (task -> files -> fdt ->
/// fd[] -> f_inode -> i_mode), from the running kernel's BTF.
pub fn file_offsets() -> Result<infertrace_common::FileOffsets, BtfError> {
    with_kernel_btf(|btf| {
        Ok(infertrace_common::FileOffsets {
            task_files: btf.offset_of("task_struct", &["files"])?,
            files_fdt: btf.offset_of("files_struct", &["fdt"])?,
            fdt_max_fds: btf.offset_of("fdtable", &["max_fds"])?,
            fdt_fd: btf.offset_of("fdtable", &["fd"])?,
            file_inode: btf.offset_of("file", &["f_inode"])?,
            inode_mode: btf.offset_of("inode", &["i_mode"])?,
        })
    })
}

/// `answer` asked of the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
fn with_kernel_btf<T>(answer: impl FnOnce(&Btf) -> Result<T, BtfError>) -> Result<T, BtfError> {
    let bytes =
        std::fs::read(KERNEL_BTF).map_err(|e| BtfError::Read(format!("{KERNEL_BTF}: {e}")))?;
    answer(&Btf::parse(&bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: `struct inner { long a; long fsbase; }`, `typedef struct inner inner_t;`,
    /// `struct outer { int x; inner_t thread; }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0inner\0a\0fsbase\0inner_t\0outer\0x\0thread\0int\0";
        let name = |s: &str| {
            let needle = format!("\0{s}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .map(|p| p as u32 + 1)
                .unwrap()
        };
        let mut types: Vec<u32> = Vec::new();
        // 1: int (4 bytes)
        types.extend([name("int"), KIND_INT << 24, 4, 32]);
        // 2: struct inner, 2 members
        types.extend([name("inner"), KIND_STRUCT << 24 | 2, 16]);
        types.extend([name("a"), 1, 0, name("fsbase"), 1, 64]);
        // 3: typedef inner_t -> 2
        types.extend([name("inner_t"), KIND_TYPEDEF << 24, 2]);
        // 4: struct outer, 2 members
        types.extend([name("outer"), KIND_STRUCT << 24 | 2, 24]);
        types.extend([name("x"), 1, 0, name("thread"), 3, 64]);
        let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend([1, 0]);
        for w in [
            24u32,
            0,
            type_bytes.len() as u32,
            type_bytes.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(w.to_le_bytes());
        }
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    #[test]
    fn nested_member_offsets_follow_typedefs() {
        let bytes = blob();
        let btf = Btf::parse(&bytes).unwrap();
        assert_eq!(btf.offset_of("outer", &["thread", "fsbase"]), Ok(16));
        assert_eq!(btf.offset_of("outer", &["x"]), Ok(0));
        assert_eq!(
            btf.offset_of("outer", &["thread", "gs"]),
            Err(BtfError::NoMember("inner".into(), "gs".into()))
        );
        assert!(matches!(
            btf.offset_of("task_struct", &["thread"]),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        let bytes = blob();
        for len in 0..bytes.len() {
            if let Ok(btf) = Btf::parse(&bytes[..len]) {
                let _ = btf.offset_of("outer", &["thread", "fsbase"]);
            }
        }
        assert!(Btf::parse(b"not btf at all").is_err());
    }

    #[test]
    fn this_kernel_says_where_an_fds_file_type_is() {
        let at = file_offsets().expect("the running kernel's BTF");
        assert!(at.known(), "{at:?}");
        // The two first members.
        assert_eq!((at.fdt_max_fds, at.inode_mode), (0, 0), "{at:?}");
    }

    #[test]
    fn this_kernel_says_where_a_tasks_tls_base_is() {
        // Every kernel this agent runs on has BTF (DESIGN.md); x86-64 has thread.fsbase.
        let offset = task_fsbase_offset().expect("the running kernel's BTF");
        assert!(offset > 0, "{offset}");
    }
}
