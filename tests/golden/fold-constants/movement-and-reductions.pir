// RUN: fold-constants
// Any pure op folds, through its NumPy reference: transpose, reshape, sum, concat, iota.
graph @f(%x: i64[3,2]) -> (i64[3,2], i64[], f32[2,2]) {
  %i = iota() {shape=[2, 3], axis=1} : i64[2,3]
  %t = transpose(%i) : i64[3,2]
  %r = add(%t, %x) : i64[3,2]
  %s = sum(%i) : i64[]
  %c = constant() {value=dense<f32[1,2], [[1.5, -2.0]]>} : f32[1,2]
  %k = concat(%c, %c) {axis=0} : f32[2,2]
  return %r, %s, %k
}
// EXPECT:
graph @f(%x: i64[3,2]) -> (i64[3,2], i64[], f32[2,2]) {
  %0 = constant() {value=dense<i64[3,2], [[0, 0], [1, 1], [2, 2]]>} : i64[3,2]
  %r = add(%0, %x) : i64[3,2]
  %1 = constant() {value=dense<i64[], 6>} : i64[]
  %2 = constant() {value=dense<f32[2,2], [[1.5, -2.0], [1.5, -2.0]]>} : f32[2,2]
  return %r, %1, %2
}
