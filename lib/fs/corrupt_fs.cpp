// Named damage to filesystem items (corrupt_fs.h). The fields and their
// places come from the structures of disk_fs.h, so they follow the format.
#include "fs/corrupt_fs.h"

#include <cstddef>
#include <cstdio>

#include "fs/disk_fs.h"
#include "fs/items.h"

namespace plyfs {
namespace {

using namespace fsitems;

struct Field {
  const char* name;
  size_t offset, size;  // within the record; size 0: the value's length
  bool after_name = false;  // offset counts from the end of the record's name
};

#define F(S, m) Field{#m, offsetof(disk::S, m), sizeof(disk::S::m)}
#define T(S, m, sub) Field{#m "." #sub, offsetof(disk::S, m) + offsetof(disk::Timespec, sub), sizeof(disk::Timespec::sub)}

const std::vector<Field>& fields_of(FsStruct s) {
  static const std::vector<Field> info{F(FsInfo, magic),  F(FsInfo, version), F(FsInfo, root_ino),
                                       F(FsInfo, created_ns), Field{"name", offsetof(disk::FsInfo, name), 1},
                                       F(FsInfo, parent), F(FsInfo, branch_flags), F(FsInfo, reserved),
                                       F(FsInfo, quota_referenced), F(FsInfo, quota_exclusive)};
  static const std::vector<Field> inode{F(Inode, mode),   F(Inode, uid),    F(Inode, gid),       F(Inode, nlink),
                                        F(Inode, size),   F(Inode, blocks), F(Inode, rdev),      F(Inode, parent),
                                        F(Inode, generation), F(Inode, flags), F(Inode, reserved0),
                                        T(Inode, atime, sec), T(Inode, mtime, nsec), T(Inode, ctime, sec),
                                        T(Inode, btime, reserved)};
  static const std::vector<Field> dirent{F(Dirent, ino), F(Dirent, type), F(Dirent, seq), F(Dirent, name_len),
                                         F(Dirent, reserved), Field{"name", sizeof(disk::Dirent), 1}};
  // An out-of-line record's XattrOutline follows its name.
  static const std::vector<Field> xattr{
      F(XattrEntry, name_len), F(XattrEntry, flags), F(XattrEntry, value_len),
      Field{"name", sizeof(disk::XattrEntry), 1},
      Field{"outline.value_id", sizeof(disk::XattrEntry) + offsetof(disk::XattrOutline, value_id), 8, true},
      Field{"outline.length", sizeof(disk::XattrEntry) + offsetof(disk::XattrOutline, length), 4, true},
      Field{"outline.reserved", sizeof(disk::XattrEntry) + offsetof(disk::XattrOutline, reserved), 4, true}};
  static const std::vector<Field> extent{F(Extent, disk_start), F(Extent, disk_nblocks), F(Extent, offset),
                                         F(Extent, nblocks),    F(Extent, compression),  F(Extent, flags),
                                         F(Extent, reserved),   Field{"csum", sizeof(disk::Extent), 8}};
  static const std::vector<Field> inl{Field{"length", 0, 0}, Field{"data", 0, 1}};
  static const std::vector<Field> chunk{Field{"length", 0, 0}, Field{"data", 0, 1}};
  static const std::vector<Field> orphan{};
  switch (s) {
    case FsStruct::FsInfo: return info;
    case FsStruct::Inode: return inode;
    case FsStruct::Dirent:
    case FsStruct::Whiteout: return dirent;
    case FsStruct::Xattr: return xattr;
    case FsStruct::Extent: return extent;
    case FsStruct::Inline: return inl;
    case FsStruct::XattrChunk: return chunk;
    case FsStruct::Orphan: return orphan;
  }
  return orphan;
}
#undef F
#undef T

uint64_t damaged(uint64_t old, size_t size, const CorruptAction& a) {
  const uint64_t mask = size >= 8 ? ~0ull : (1ull << (8 * size)) - 1;
  switch (a.how) {
    case Damage::Set: return a.value & mask;
    case Damage::Flip: return (old ^ (1ull << (a.bit % (8 * size)))) & mask;
    case Damage::Zero: return 0;
    case Damage::Add: return (old + a.value) & mask;
  }
  return old;
}

uint64_t load(std::span<const std::byte> v, size_t at, size_t n) {
  uint64_t x = 0;
  for (size_t i = 0; i < n; i++) x |= uint64_t(v[at + i]) << (8 * i);
  return x;
}
void store(std::span<std::byte> v, size_t at, size_t n, uint64_t x) {
  for (size_t i = 0; i < n; i++) v[at + i] = std::byte(x >> (8 * i));
}

Key key_of(const FsTarget& t) {
  switch (t.what) {
    case FsStruct::FsInfo: return ikey(0, ItemType::FsInfo);
    case FsStruct::Inode: return ikey(t.ino, ItemType::Inode);
    case FsStruct::Dirent:
    case FsStruct::Whiteout: return ikey(t.ino, ItemType::Dirent, name_hash(t.name));
    case FsStruct::Xattr: return ikey(t.ino, ItemType::Xattr, name_hash(t.name));
    case FsStruct::Extent: return ikey(t.ino, ItemType::Extent, t.offset);
    case FsStruct::Inline: return ikey(t.ino, ItemType::Inline, t.offset);
    case FsStruct::XattrChunk: break;  // its record gives the value id (chunk_key)
    case FsStruct::Orphan: return ikey(0, ItemType::Orphan, t.ino);
  }
  return Key{};
}

// The chunk at byte `offset` of the out-of-line value of xattr `name`.
Result<Key> chunk_key(Volume::Txn& txn, const FsTarget& t) {
  const Key k = ikey(t.ino, ItemType::Xattr, name_hash(t.name));
  auto v = PLY_TRY(txn.get(t.tree, k));
  if (v)
    for (const auto& x : PLY_TRY(decode_xattrs(k, *v)))
      if (x.name == t.name) {
        if (!x.outline) return Error::invalid("xattr \"" + t.name + "\" is not out of line");
        return xattr_chunk_key(t.ino, x.value_id, t.offset);
      }
  return Error::io(ENOENT, "no xattr named \"" + t.name + "\"");
}

// Where the named record starts in a Dirent or Xattr item.
Result<size_t> record_at(const FsTarget& t, std::span<const std::byte> v) {
  const bool dir = t.what == FsStruct::Dirent || t.what == FsStruct::Whiteout;
  size_t p = 0;
  while (p < v.size()) {
    const size_t head = dir ? sizeof(disk::Dirent) : sizeof(disk::XattrEntry);
    if (v.size() - p < head) break;
    size_t n, skip;
    if (dir) {
      const auto* d = view_as<disk::Dirent>(v, p);
      n = d->name_len;
      skip = head + n;
      if ((d->type == disk::kDtWhiteout) != (t.what == FsStruct::Whiteout)) n = 0;  // not this kind
    } else {
      const auto* d = view_as<disk::XattrEntry>(v, p);
      n = d->name_len;
      skip = head + n + d->value_len.get();
    }
    if (v.size() - p < skip) break;
    if (n == t.name.size() && std::memcmp(v.data() + p + head, t.name.data(), n) == 0) return p;
    p += skip;
  }
  return Error::io(ENOENT, std::string("no ") + fs_struct_name(t.what) + " named \"" + t.name + "\"");
}

// The change itself, in one transaction that ends before the commit.
Result<std::string> damage_item(Volume& vol, const FsTarget& t, const CorruptAction& a) {
  auto txn = PLY_TRY(vol.begin({.reserve_blocks = 40}));
  const Key k = t.what == FsStruct::XattrChunk ? PLY_TRY(chunk_key(txn, t)) : key_of(t);
  auto got = PLY_TRY(txn.get(t.tree, k));
  if (!got) return Error::io(ENOENT, std::string("no ") + fs_struct_name(t.what) + " item there");
  std::vector<std::byte> v = std::move(*got);
  std::string what = std::string(fs_struct_name(t.what)) + " " + t.field + ": ";
  if (t.field == "key.hi" || t.field == "key.off") {
    Key nk = k;
    if (t.field == "key.hi") nk.hi = damaged(k.hi, 8, a);
    else nk.lo = (k.lo & ~kOffMask) | (damaged(off_of(k), 7, a) & kOffMask);
    (void)PLY_TRY(txn.erase(t.tree, k));
    PLY_CHECK(txn.put(t.tree, nk, v));
    what += "moved from (" + std::to_string(k.hi) + ", " + std::to_string(k.lo) + ") to (" +
            std::to_string(nk.hi) + ", " + std::to_string(nk.lo) + ")" + (nk == k ? " (unchanged)" : "");
  } else {
    const Field* f = nullptr;
    for (const auto& x : fields_of(t.what))
      if (t.field == x.name) f = &x;
    // FsInfo's name.N: byte N of the name (format.md#fs-info).
    Field name_byte{"name.N", offsetof(disk::FsInfo, name), 1};
    unsigned n = 0;
    char end = 0;
    if (!f && t.what == FsStruct::FsInfo && std::sscanf(t.field.c_str(), "name.%u%c", &n, &end) == 1 &&
        n < sizeof(disk::FsInfo::name)) {
      name_byte.offset += n;
      f = &name_byte;
    }
    if (!f) return Error::invalid("no field \"" + t.field + "\" in " + fs_struct_name(t.what));
    size_t base = 0;
    if (t.what == FsStruct::Dirent || t.what == FsStruct::Whiteout || t.what == FsStruct::Xattr)
      base = PLY_TRY(record_at(t, v));
    if (f->after_name) base += t.name.size();
    if (f->size == 0) {  // the length of the value
      const uint64_t old = v.size(), n = damaged(old, 2, a);
      v.resize(n);
      what += std::to_string(old) + " -> " + std::to_string(n) + " bytes" + (n == old ? " (unchanged)" : "");
    } else {
      if (base + f->offset + f->size > v.size())
        return Error::invalid("the " + std::string(fs_struct_name(t.what)) + " item has no " + t.field);
      const uint64_t old = load(v, base + f->offset, f->size), n = damaged(old, f->size, a);
      store(v, base + f->offset, f->size, n);
      what += std::to_string(old) + " -> " + std::to_string(n) + (n == old ? " (unchanged)" : "");
    }
    PLY_CHECK(txn.put(t.tree, k, v));
  }
  return what;
}

}  // namespace

const char* fs_struct_name(FsStruct s) {
  switch (s) {
    case FsStruct::FsInfo: return "fsinfo";
    case FsStruct::Inode: return "inode";
    case FsStruct::Dirent: return "dirent";
    case FsStruct::Whiteout: return "whiteout";
    case FsStruct::Xattr: return "xattr";
    case FsStruct::Extent: return "extent";
    case FsStruct::Inline: return "inline";
    case FsStruct::XattrChunk: return "xattr-chunk";
    case FsStruct::Orphan: return "orphan";
  }
  return "?";
}

Result<FsStruct> fs_struct_named(std::string_view s) {
  for (auto c : {FsStruct::FsInfo, FsStruct::Inode, FsStruct::Dirent, FsStruct::Whiteout, FsStruct::Xattr,
                 FsStruct::Extent, FsStruct::Inline, FsStruct::XattrChunk, FsStruct::Orphan})
    if (s == fs_struct_name(c)) return c;
  return Error::invalid("unknown structure '" + std::string(s) + "'");
}

std::vector<std::string> fs_corrupt_fields(FsStruct s) {
  std::vector<std::string> out;
  for (const auto& f : fields_of(s)) out.push_back(f.name);
  if (s == FsStruct::FsInfo) out.push_back("name.N");
  out.push_back("key.hi");
  out.push_back("key.off");
  for (const char* f : {"leaf.key.hi", "leaf.key.lo", "leaf.value_offset", "leaf.value_len", "leaf.first.key.hi",
                        "leaf.first.key.lo", "leaf.last.key.hi", "leaf.last.key.lo"})
    out.push_back(f);
  return out;
}

Result<std::string> corrupt_fs(Volume& vol, const FsTarget& t, const CorruptAction& a) {
  if (t.field.starts_with("leaf.")) {
    if (!t.dev) return Error::invalid("the leaf fields need the device");
    // Where the item lies now: the key the named structure has.
    Key k;
    {
      auto txn = PLY_TRY(vol.begin());
      k = t.what == FsStruct::XattrChunk ? PLY_TRY(chunk_key(txn, t)) : key_of(t);
      if (!PLY_TRY(txn.get(t.tree, k)))
        return Error::io(ENOENT, std::string("no ") + fs_struct_name(t.what) + " item there");
    }
    std::string what = PLY_TRY(corrupt_leaf_item(*t.dev, t.tree.v, k.hi, k.lo, t.field.substr(5), a));
    return std::string(fs_struct_name(t.what)) + " " + t.field + ": " + what;
  }
  std::string what = PLY_TRY(damage_item(vol, t, a));
  PLY_CHECK(vol.commit());
  return what;
}

}  // namespace plyfs
