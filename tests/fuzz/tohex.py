#!/usr/bin/env python3
"""Turns fuzzer inputs (binary files) into the text hex dumps kept in the
repository, and back (--binary), so that the corpus can seed libFuzzer.
  tohex.py [--note TEXT] FILE...          write FILE.hex beside each FILE
  tohex.py --binary DIR_IN DIR_OUT        every *.hex in DIR_IN as binary in DIR_OUT
"""
import os, sys

def to_hex(path, note):
    data = open(path, 'rb').read()
    with open(path + '.hex', 'w') as f:
        f.write(f'# {note}\n')
        for i in range(0, len(data), 32):
            f.write(data[i:i + 32].hex() + '\n')

def from_hex(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        if not name.endswith('.hex'):
            continue
        hex_text = ''.join(l.split('#')[0].strip() for l in open(os.path.join(src, name)))
        open(os.path.join(dst, name[:-4]), 'wb').write(bytes.fromhex(hex_text))

if __name__ == '__main__':
    args = sys.argv[1:]
    if args and args[0] == '--binary':
        from_hex(args[1], args[2])
    else:
        note = 'fuzzer input'
        if args and args[0] == '--note':
            note, args = args[1], args[2:]
        for p in args:
            to_hex(p, note)
