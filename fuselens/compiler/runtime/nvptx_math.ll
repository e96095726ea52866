; LLVM IR library of the Triton prelude's NVIDIA helpers (codegen/triton_ops.py:
; PTX_HELPERS). Generated kernels call these through `tl.extern_elementwise`, and
; every kernel is compiled with this file in Triton's `extern_libs` option
; (triton_ops.compile_options), which links it as it links libdevice.
;
; Why not Triton code: sin/cos of float32 need, for the rare |x| > 8192, a
; Payne-Hanek reduction. Written in Triton it is inlined once per element a thread
; holds (8 in a 1024-element block of 4 warps), and a block-wide max decides
; whether to take it; LLVM and ptxas then spent ~0.1 s of sin^2+cos^2's ~0.2 s
; compile on it. Here the per-element test is a branch (no block-wide reduction),
; and the reduction is one `noinline` function: compiled once, called per element
; only where |x| > 8192 (or inf/nan). Checked bit for bit against the Triton form
; (the interpreter's, `_fl_reduce_large`) on 200k arguments over the whole range.
;
; Return values pack (q, r) of x = q pi/2 + r as (q << 32) | bits(r), one i64:
; extern_elementwise returns one value; LLVM removes the packing once inlined.

target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

; 2/pi in 32-bit words at byte steps (ARM optimized-routines' __inv_pio4)
@__fl_inv_pio4 = internal addrspace(1) constant [24 x i32] [i32 u0xa2, i32 u0xa2f9, i32 u0xa2f983, i32 u0xa2f9836e, i32 u0xf9836e4e, i32 u0x836e4e44, i32 u0x6e4e4415, i32 u0x4e441529, i32 u0x441529fc, i32 u0x1529fc27, i32 u0x29fc2757, i32 u0xfc2757d1, i32 u0x2757d1f5, i32 u0x57d1f534, i32 u0xd1f534dd, i32 u0xf534ddc0, i32 u0x34ddc0db, i32 u0xddc0db62, i32 u0xc0db6295, i32 u0xdb629599, i32 u0x6295993c, i32 u0x95993c43, i32 u0x993c4390, i32 u0x3c439041], align 4

; (q, r) of float32 x, given Cody-Waite's (q, r), exact for |x| <= 8192: those
; where |x| <= 8192, else the large-argument reduction's (nan r for inf and nan).
define i64 @__fl_sincos_arg(float %x, i32 %q, float %r) #0 {
entry:
  %a = call float @llvm.fabs.f32(float %x)
  %big = fcmp ugt float %a, 8.192000e+03
  br i1 %big, label %large, label %small
small:
  %qw = zext i32 %q to i64
  %qs = shl i64 %qw, 32
  %rbits = bitcast float %r to i32
  %rw = zext i32 %rbits to i64
  %o = or i64 %qs, %rw
  ret i64 %o
large:
  %l = call i64 @__fl_sincos_large(float %x)
  ret i64 %l
}

; |x| > 8192, inf or nan: x's sign on the reduction of |x|, x = -(n pi/2 + r) =
; (-n) pi/2 + (-r); inf and nan give q = 0, r = nan.
define i64 @__fl_sincos_large(float %x) #1 {
entry:
  %a = call float @llvm.fabs.f32(float %x)
  %fin = fcmp olt float %a, 0x7FF0000000000000
  br i1 %fin, label %reduce, label %nonfinite
nonfinite:
  ret i64 2143289344
reduce:
  %p = call i64 @__fl_reduce_large(float %a)
  %neg = fcmp olt float %x, 0.000000e+00
  br i1 %neg, label %negate, label %positive
positive:
  ret i64 %p
negate:
  %nh = lshr i64 %p, 32
  %n = trunc i64 %nh to i32
  %nn = sub i32 0, %n
  %nnw = zext i32 %nn to i64
  %nns = shl i64 %nnw, 32
  %rl = and i64 %p, 4294967295
  %rn = xor i64 %rl, 2147483648
  %on = or i64 %nns, %rn
  ret i64 %on
}

; finite a >= 2^13: a = n pi/2 + r, n in [0, 3], r in [-pi/4, pi/4], ARM
; optimized-routines' reduce_large (sincosf.h): the 24-bit mantissa times a 96-bit
; window of 2/pi (where the exponent says) gives a 2/pi mod 4 in 2.62 fixed point,
; exactly; r is accurate to 33 bits before its rounding to float.
define internal i64 @__fl_reduce_large(float %a) #0 {
entry:
  %xi = bitcast float %a to i32
  %i0 = lshr i32 %xi, 26
  %idx = and i32 %i0, 15
  %s0 = lshr i32 %xi, 23
  %shift = and i32 %s0, 7
  %m0 = and i32 %xi, 16777215
  %m1 = or i32 %m0, 8388608
  %m = shl i32 %m1, %shift
  %idx64 = zext i32 %idx to i64
  %p0 = getelementptr inbounds [24 x i32], ptr addrspace(1) @__fl_inv_pio4, i64 0, i64 %idx64
  %w0 = load i32, ptr addrspace(1) %p0, align 4
  %idx4 = add nuw nsw i64 %idx64, 4
  %p4 = getelementptr inbounds [24 x i32], ptr addrspace(1) @__fl_inv_pio4, i64 0, i64 %idx4
  %w4 = load i32, ptr addrspace(1) %p4, align 4
  %idx8 = add nuw nsw i64 %idx64, 8
  %p8 = getelementptr inbounds [24 x i32], ptr addrspace(1) @__fl_inv_pio4, i64 0, i64 %idx8
  %w8 = load i32, ptr addrspace(1) %p8, align 4
  %r0 = mul i32 %m, %w0
  %m64 = zext i32 %m to i64
  %w4w = zext i32 %w4 to i64
  %w8w = zext i32 %w8 to i64
  %r1 = mul i64 %m64, %w4w
  %r2 = mul i64 %m64, %w8w
  %r2h = lshr i64 %r2, 32
  %r0w = zext i32 %r0 to i64
  %r0s = shl i64 %r0w, 32
  %r0o = or i64 %r2h, %r0s
  %res = add i64 %r0o, %r1
  %t = add i64 %res, 2305843009213693952
  %n = lshr i64 %t, 62
  %ns = shl i64 %n, 62
  %res2 = sub i64 %res, %ns
  %xd = sitofp i64 %res2 to double
  %rd = fmul double %xd, 0x3C1921FB54442D18
  %rf = fptrunc double %rd to float
  %rb = bitcast float %rf to i32
  %rbw = zext i32 %rb to i64
  %nh = shl i64 %n, 32
  %out = or i64 %nh, %rbw
  ret i64 %out
}

declare float @llvm.fabs.f32(float)

attributes #0 = { alwaysinline nounwind willreturn memory(read) }
attributes #1 = { noinline nounwind willreturn memory(read) }
